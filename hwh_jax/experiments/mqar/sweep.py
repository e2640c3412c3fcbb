"""The MQAR sweep run, continued and merged: every (architecture, width) cell into one folder
(``sweep``: results.json, table.md, mqar_sweep.png rewritten after each cell) and folders of
other cells joined (``merge``)."""

from __future__ import annotations

import dataclasses
import json
import statistics

from hwh_jax import storage
from hwh_jax.experiments.mqar.report import figure, summarize, table
from hwh_jax.experiments.mqar.spec import SweepSpec
from hwh_jax.experiments.mqar.train import Stopped, run_cell
from hwh_jax.training.signals import StopOnSignal


def _differences(spec: dict, other: dict):
    """(key, value, other's value) for each field of two saved specs that differs, but the
    architectures and widths (sweeps of other cells of the same settings may be joined)."""
    return [
        (k, v, other.get(k))
        for k, v in spec.items()
        if k not in ("archs", "widths") and v != other.get(k)
    ]


def sweep(spec: SweepSpec, out: storage.PathLike, log=print, save_every: int = 1000) -> list[dict]:
    """Run every (arch, width) cell; ``out``/results.json (rows, cells, spec), table.md and
    mqar_sweep.png, rewritten after each cell so a cut sweep keeps what it measured.

    Run again into the same ``out`` with the same spec, it continues: the cells in results.json
    are kept, and a cell cut by SIGTERM / SIGINT (or a kill: its last ``save_every``) goes on
    from its saved trials (``out``/partial_ARCH_WIDTH.npz, deleted once the cell is done)."""
    spec.validate()
    if save_every < 1:
        raise ValueError(f"--save_every must be >= 1, got {save_every}")
    out = storage.path(out)
    out.mkdir(parents=True, exist_ok=True)
    cells_done, rows = [], []
    if (out / "results.json").exists():
        before = json.loads((out / "results.json").read_text())
        mine = json.loads(json.dumps(dataclasses.asdict(spec)))
        for key, value, other in _differences(before["spec"], mine):
            raise ValueError(
                f"{out} holds a sweep with {key}={value!r}, not {other!r}: use "
                f"another --out for other settings"
            )
        cells_done, rows = before["runs"], before["rows"]
    kept = {_cell_key(r) for r in cells_done}
    zoology = spec.mode == "zoology"
    todo = [  # (arch, width, the spec its models train under, its setting in zoology mode)
        (a, w, spec.for_setting(i) if zoology else spec, spec.settings[i] if zoology else None)
        for a in spec.archs
        for w in spec.widths
        for i in range(len(spec.settings) if zoology else 1)
    ]
    with StopOnSignal("saving the trials and stopping after this step") as stop:
        for i, (arch, width, cell_spec, setting) in enumerate(todo):
            name = f"{arch} d={width}" + (f" T={setting[0]}:{setting[1]}" if setting else "")
            at = f"[{i + 1}/{len(todo)}] {name}"
            if (arch, width, setting) in kept:
                log(f"{at}: in {out / 'results.json'} already")
                continue
            if stop.signal:
                raise Stopped(
                    f"stopped by {stop.signal} before {name}; the same command continues the sweep"
                )
            log(
                f"{at}: {len(spec.seeds)} seeds x {len(spec.lrs)} learning rates, "
                f"{cell_spec.steps} steps of {cell_spec.batch_size}"
            )
            suffix = f"_{setting[0]}_{setting[1]}" if setting else ""
            partial = out / f"partial_{arch}_{width}{suffix}.npz"
            cell = run_cell(
                arch, width, cell_spec, log=log, partial=partial, save_every=save_every, stop=stop
            )
            if setting:
                cell.update(seq_len=setting[0], pairs=setting[1])
            rows += cell["rows"]
            cells_done.append({k: v for k, v in cell.items() if k != "rows"})
            _write(out, dataclasses.asdict(spec), cells_done, rows)
            partial.unlink(missing_ok=True)
            mean = statistics.mean(r["accuracy"] for r in cell["rows"])
            log(
                f"{at}: mean accuracy {mean:.3f} over {len(cell_spec.settings)} "
                f"settings and the seeds ({cell['seconds']:.0f}s)"
            )
    return summarize(rows)


def _cell_key(run: dict) -> tuple:
    """A finished run's cell: (arch, width, None), or (arch, width, (T, pairs)) in Zoology
    mode, where each setting is a model of its own."""
    setting = (run["seq_len"], run["pairs"]) if "seq_len" in run else None
    return run["arch"], run["width"], setting


def merge(folders: list[storage.PathLike], out: storage.PathLike) -> list[dict]:
    """Sweeps run apart (one process per architecture, side by side) as one: their rows
    summarised together into ``out``'s results.json, table.md and mqar_sweep.png. Every spec
    field but the architectures and widths must agree (else the error names the field); a cell
    (architecture, width) found in two folders is an error too. A folder that is itself a merge
    counts as the folders it came from (``merged_from`` lists the sweeps' own folders)."""
    loaded = []
    for folder in folders:
        path = storage.path(folder) / "results.json"
        if not path.exists():
            raise FileNotFoundError(
                f"--report: {path} does not exist (a sweep's --out folder holds it)"
            )
        loaded.append((path, json.loads(path.read_text())))
    first_path, first = loaded[0]
    spec = dict(first["spec"])
    runs, rows, seen, sources = [], [], {}, []
    for (path, res), folder in zip(loaded, folders):
        sources += res.get("merged_from", [str(folder)])
        for key, value, other in _differences(res["spec"], first["spec"]):
            raise ValueError(
                f"--report: {path} has {key}={value!r}, {first_path} "
                f"{other!r}: sweeps of other settings"
            )
        for run in res["runs"]:
            cell = _cell_key(run)
            if cell in seen:
                raise ValueError(f"--report: {cell[0]} d={cell[1]} is in {seen[cell]} and {path}")
            seen[cell] = path
        runs += res["runs"]
        rows += res["rows"]
    out = storage.path(out)
    out.mkdir(parents=True, exist_ok=True)
    return _write(out, spec, runs, rows, merged_from=sources)


def _write(
    out: storage.PathLike, spec: dict, runs: list[dict], rows: list[dict], **extra
) -> list[dict]:
    """results.json (the spec with the architectures and widths of ``runs``, the runs, the
    cells summarised from ``rows``, the rows and ``extra``), table.md and mqar_sweep.png into
    ``out``; the cells."""
    spec = {
        **spec,
        "archs": list(dict.fromkeys(r["arch"] for r in runs)),
        "widths": sorted({r["width"] for r in runs}),
    }
    cells = summarize(rows)
    (out / "results.json").write_text(
        json.dumps({"spec": spec, "runs": runs, "cells": cells, "rows": rows, **extra}, indent=1)
    )
    (out / "table.md").write_text(table(cells) + "\n")
    figure(cells, out / "mqar_sweep.png")
    return cells
