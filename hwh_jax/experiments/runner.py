"""Runs of an experiment: one training with its closing evaluation and summary, the same over
several seeds, and the layer-wise ratio grid, each run a process of ``launch.experiment``
(``side_by_side`` of them at once; small models share one GPU, each process an equal share of
its memory), then the tables over them (``report.py``). ``launch.experiment`` is its command
line."""

from __future__ import annotations

import json
import os
import sys

from hwh_jax import storage
from hwh_jax.experiments.processes import run_side_by_side
from hwh_jax.experiments.report import (
    over_seeds,
    report,
    seeds_length_table,
    seeds_table,
    summarize,
)


class RunsFailed(RuntimeError):
    """Some runs of a group did not finish (their consoles say why)."""


def tokens(n: int) -> str:
    """4,096 / 1.2M / 10.5B: a token count at a readable scale (never "0.0M")."""
    for unit, size in (("B", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:,}"


def train_and_summarize(config, out) -> dict:
    """Train ``config`` into ``out`` with its closing evaluation (the trainer of
    ``launch.train``), then write ``experiment.json`` (params, tokens, wall time, tokens/s, MFU,
    NIAH, MQAR) and return it with a one-line description under "line"."""
    from hwh_jax.training.trainer import train_and_evaluate

    if not config.eval.at_end:
        raise ValueError("an experiment needs its closing evaluation: config.eval.at_end")
    train_and_evaluate(config, out)
    exp = summarize(out)
    path = os.path.join(out, "experiment.json")
    kept = {k: v for k, v in exp.items() if k != "results"}
    with open(path, "w") as f:
        json.dump(kept, f, indent=2)
    kept["line"] = (
        f"experiment {exp['name']} ({exp['arch']}, {exp['params'] / 1e6:.1f}M params, "
        f"{tokens(exp['tokens'])} tokens): NIAH "
        + ", ".join(f"{k} {v:.0f}" for k, v in exp["niah"].items())
        + f" -> {path}"
    )
    return kept


def finished(workdir) -> bool:
    """Whether ``workdir`` holds a run that trained and finished its closing evaluation (its
    experiment.json, and eval/results.json not marked unfinished): a group's command run again
    skips it. A run stopped before or during its evaluation is not finished: that command
    continues it from its checkpoint (``launch.train``'s resume)."""
    workdir = storage.path(workdir)
    if not (workdir / "experiment.json").exists():
        return False
    results = workdir / "eval" / "results.json"
    return results.exists() and json.loads(results.read_text()).get("finished", True)


def _pending(jobs, workdirs):
    """The jobs whose run is not ``finished``; a line for each one skipped."""
    keep = []
    for job, workdir in zip(jobs, workdirs, strict=True):
        if finished(workdir):
            print(f"{job[0]}: finished already ({workdir}): not run again", flush=True)
        else:
            keep.append(job)
    return keep


def _run_all(jobs, side_by_side: int, out, what: str) -> None:
    """``jobs`` (name, argv, console) as processes, ``side_by_side`` at a time; RunsFailed
    naming those that did not finish."""
    env = dict(os.environ)
    if side_by_side > 1:  # on a GPU, each process its share of the memory
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / side_by_side:.3f}")
    failed, stopped = run_side_by_side(jobs, side_by_side, env)
    if failed or stopped:
        raise RunsFailed(
            f"{', '.join(failed) or f'no {what}'} did not finish"
            + (" (stopped by a signal: the same command continues)" if stopped else "")
            + f"; consoles in {out}"
        )


def seeds(child_argv: list[str], seed_list: list[int], side_by_side: int, out) -> str:
    """One run per seed (``launch.experiment`` with ``child_argv`` and ``--config.seed=N``) in
    ``out/seed<N>``, then ``out/seeds.json`` (each NIAH cell's mean, standard deviation, range
    and pooled interval over the seeds); returns the tables over the seeds. Seeds already
    ``finished`` there are not run again."""
    if len(set(seed_list)) != len(seed_list):
        raise ValueError(f"--seeds has a seed twice: {seed_list}")
    if side_by_side < 1:
        raise ValueError(f"--side_by_side must be >= 1, got {side_by_side}")
    out = storage.path(out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [
        (
            f"seed {s}",
            [
                sys.executable,
                "-m",
                "launch.experiment",
                *child_argv,
                f"--config.seed={s}",
                f"--out={out / f'seed{s}'}",
            ],
            out / f"seed{s}.console.log",
        )
        for s in seed_list
    ]
    _run_all(_pending(jobs, [out / f"seed{s}" for s in seed_list]), side_by_side, out, "seed")
    over = {"name": out.name, **over_seeds([summarize(out / f"seed{s}") for s in seed_list])}
    (out / "seeds.json").write_text(json.dumps(over, indent=2))
    return (
        f"over {len(seed_list)} seeds -> {out / 'seeds.json'}\n{seeds_table([over])}\n\n"
        f"{seeds_length_table([over])}"
    )


def grid_cells(get_config, mixers, ratios, length: int, cpu: bool = False) -> list[tuple[str, str]]:
    """(cell name, configs/experiment.py argument) of the layer-wise hybrid at every (kind,
    ratio), each checked by building it with ``get_config`` (configs/experiment.py's: the
    launcher passes it, so that the library does not import the configs above it)."""
    from hwh_jax.training.specs import model_for_run

    if not mixers or not ratios:
        raise ValueError("a grid needs both --mixers and --ratios")
    cells = []
    for kind in mixers:
        for ratio in ratios:
            arg = f"layerwise/{kind}/{ratio},{length}" + (",cpu" if cpu else "")
            config = get_config(arg)  # a bad kind or ratio: refused now, named
            model_for_run(config, 1)  # the schedule: a ratio with no FA layer is refused here
            cells.append((f"{kind}_{ratio}", arg))
    return cells


def grid(cells, side_by_side: int, out, config_file: str) -> str:
    """Every cell of ``grid_cells`` trained into ``out/<cell>`` (``config_file``: the path of
    configs/experiment.py), then the report over them; returns it."""
    out = storage.path(out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [
        (
            name,
            [
                sys.executable,
                "-m",
                "launch.experiment",
                f"--config={config_file}:{arg}",
                f"--out={out / name}",
            ],
            out / f"{name}.console.log",
        )
        for name, arg in cells
    ]
    _run_all(_pending(jobs, [out / name for name, _ in cells]), side_by_side, out, "cell")
    return report([out / name for name, _ in cells], out)
