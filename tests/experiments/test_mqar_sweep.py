"""MQAR as a training task: the vmapped trials equal trials trained alone, and a tiny sweep
writes its results, table and figure with one cell per (arch, width, setting)."""

import json

import pytest

from hwh_jax.experiments.mqar import data as mqar_data
from hwh_jax.experiments.mqar import spec as mqar_spec
from hwh_jax.experiments.mqar import sweep as mqar_sweep
from hwh_jax.experiments.mqar import train as mqar_train
from hwh_jax.experiments.mqar.spec import SweepSpec
from hwh_jax.models.lm import HybridLM

TINY = dict(
    widths=(32,),
    settings=((16, 2), (32, 4)),
    vocab=64,
    heads=4,
    steps=4,
    batch_size=8,
    lrs=(3e-3,),
    eval_examples=8,
    warmup_steps=1,
    dtype="float32",
)


def test_trials_trained_together_equal_a_trial_trained_alone():
    """Seeds 0 and 1 in one vmapped program against seed 1 alone: the same final loss and the
    same test queries right (fp32, CPU)."""
    both = mqar_train.run_cell(
        "transformer", 32, SweepSpec(seeds=(0, 1), **TINY), log=lambda s: None
    )
    alone = mqar_train.run_cell(
        "transformer", 32, SweepSpec(seeds=(1,), **TINY), log=lambda s: None
    )
    pick = [r for r in both["rows"] if r["seed"] == 1]
    assert len(pick) == len(alone["rows"]) == 2
    for a, b in zip(pick, alone["rows"]):
        assert a["final_loss"] == pytest.approx(b["final_loss"], rel=1e-5)
        assert a["right"] == b["right"] and a["queries"] == b["queries"]
    assert both["rows"][0]["final_loss"] != pick[0]["final_loss"]  # the seeds differ


def test_a_tiny_sweep_writes_cells_with_intervals(tmp_path):
    spec = SweepSpec(archs=("transformer",), seeds=(0, 1), **{**TINY, "lrs": (1e-3, 3e-3)})
    lines = []
    cells = mqar_sweep.sweep(spec, tmp_path, log=lines.append)
    assert len(cells) == 2 and any("[1/1] transformer d=32: mean accuracy" in s for s in lines)
    for c in cells:
        assert c["seeds"] == 2 and c["queries"] == 2 * 8 * c["pairs"]
        assert 0 <= c["lo"] <= c["mean"] <= c["hi"] <= 1
        assert set(c["lrs"]) <= {1e-3, 3e-3}
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved["rows"]) == 2 * 2 and saved["spec"]["steps"] == 4
    assert "| transformer | 32 |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "mqar_sweep.png").stat().st_size > 0


def test_a_sweep_stopped_by_sigterm_continues_as_if_uninterrupted(tmp_path):
    """SIGTERM during a cell (step 2 of 4): the trials are saved after the next step and the
    sweep stops; the same sweep into the same folder goes on from step 3 and ends with the
    uninterrupted sweep's losses and answers (fp32, CPU); run once more it trains nothing, and
    a sweep of other settings into the folder is refused naming the field."""
    import os
    import signal

    spec = SweepSpec(archs=("transformer",), seeds=(0,), **{**TINY, "lrs": (3e-3, 1e-2)})
    straight = mqar_sweep.sweep(spec, tmp_path / "straight", log=lambda s: None)

    def log(line):
        lines.append(line)
        if "step 2/4" in line:
            os.kill(os.getpid(), signal.SIGTERM)

    lines, cut = [], tmp_path / "cut"
    with pytest.raises(mqar_train.Stopped, match="at step 3/4 of transformer d=32"):
        mqar_sweep.sweep(spec, cut, log=log)
    assert (cut / "partial_transformer_32.npz").exists() and not (cut / "results.json").exists()
    lines = []
    assert mqar_sweep.sweep(spec, cut, log=log) == straight
    assert any("continuing from step 3" in s for s in lines)
    assert not (cut / "partial_transformer_32.npz").exists()
    rows = lambda d: json.loads((d / "results.json").read_text())["rows"]
    assert rows(cut) == rows(tmp_path / "straight")  # final losses included
    lines = []
    assert mqar_sweep.sweep(spec, cut, log=lines.append) == straight
    assert lines == [f"[1/1] transformer d=32: in {cut / 'results.json'} already"]
    with pytest.raises(ValueError, match="steps=4"):
        mqar_sweep.sweep(
            SweepSpec(archs=("transformer",), seeds=(0,), **{**TINY, "steps": 5}),
            cut,
            log=lambda s: None,
        )


def test_sweeps_run_apart_merge_into_one(tmp_path):
    """Two sweeps in two folders (the second a copy of the first relabelled as another
    architecture: merging reads files, not models), merged: the cells of both, each equal to its
    own folder's; a sweep of other steps, or a cell twice, is refused naming why."""
    import shutil

    cells = mqar_sweep.sweep(
        SweepSpec(archs=("transformer",), seeds=(0,), **TINY),
        tmp_path / "transformer",
        log=lambda s: None,
    )
    shutil.copytree(tmp_path / "transformer", tmp_path / "gdn")
    other = json.loads((tmp_path / "gdn" / "results.json").read_text())
    for r in other["runs"] + other["rows"]:
        r["arch"] = "gdn"
    (tmp_path / "gdn" / "results.json").write_text(json.dumps(other))
    merged = mqar_sweep.merge([tmp_path / "transformer", tmp_path / "gdn"], tmp_path / "all")
    key = lambda c: (c["arch"], c["width"], c["seq_len"])
    want = cells + [{**c, "arch": "gdn"} for c in cells]
    assert sorted(merged, key=key) == sorted(want, key=key)
    saved = json.loads((tmp_path / "all" / "results.json").read_text())
    assert saved["spec"]["archs"] == ["transformer", "gdn"] and len(saved["runs"]) == 2
    assert (tmp_path / "all" / "mqar_sweep.png").exists()
    assert saved["merged_from"] == [str(tmp_path / "transformer"), str(tmp_path / "gdn")]
    shutil.copytree(tmp_path / "transformer", tmp_path / "more")  # a merge merged again
    more = json.loads((tmp_path / "more" / "results.json").read_text())
    for r in more["runs"] + more["rows"]:
        r["arch"] = "hwh"
    (tmp_path / "more" / "results.json").write_text(json.dumps(more))
    again = mqar_sweep.merge([tmp_path / "all", tmp_path / "more"], tmp_path / "again")
    assert sorted(again, key=key) == sorted(want + [{**c, "arch": "hwh"} for c in cells], key=key)
    assert json.loads((tmp_path / "again" / "results.json").read_text())["merged_from"] == [
        str(tmp_path / "transformer"),
        str(tmp_path / "gdn"),
        str(tmp_path / "more"),
    ]
    with pytest.raises(ValueError, match="transformer d=32 is in"):
        mqar_sweep.merge([tmp_path / "transformer", tmp_path / "transformer"], tmp_path / "x")
    other["spec"]["steps"] = 5
    (tmp_path / "gdn" / "results.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="steps=5"):
        mqar_sweep.merge([tmp_path / "transformer", tmp_path / "gdn"], tmp_path / "x")


def test_bad_sweep_settings_name_the_flag():
    with pytest.raises(ValueError, match="--widths"):
        SweepSpec(widths=(30,)).validate()
    with pytest.raises(ValueError, match="--settings"):
        SweepSpec(settings=((16, 8),)).validate()
    with pytest.raises(ValueError, match="--archs"):
        SweepSpec(archs=("mamba",)).validate()


def test_the_grouped_loss_and_hits_equal_zoologys_padded_batch_over_every_position():
    """The trials train on one group per setting at its own length and run the LM head at the
    query positions only; their loss and correct queries equal Zoology's form: every row padded
    to the longest, the masked loss and argmax over the logits of every position (fp32)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from hwh_jax.eval.mqar import IGNORE
    from hwh_jax.layers.loss import cross_entropy

    spec = SweepSpec(seeds=(0, 1), **TINY)
    cfg = mqar_spec.sweep_config("gdn", 32, spec)
    init, step, hits, _ = mqar_train._trial_steps(cfg, spec)
    states = init(jnp.asarray([0, 1], jnp.int32))
    groups = mqar_data.train_batch(spec, 0)
    assert [g[0].shape for g in groups] == [(4, 16), (4, 32)]
    assert [g[2].shape for g in groups] == [(4, 2), (4, 4)]
    x = np.concatenate([np.pad(g[0], ((0, 0), (0, 32 - g[0].shape[1]))) for g in groups])
    y = np.full(x.shape, IGNORE, np.int32)
    for r, (where, answers) in enumerate((w, a) for g in groups for w, a in zip(g[1], g[2])):
        y[r, where] = answers
    graphdef = nnx.graphdef(HybridLM(cfg, rngs=nnx.Rngs(0)))

    @jax.vmap
    def zoology(params):  # every position's logits, the masked loss, right per row
        model = nnx.merge(graphdef, params)
        logits = model.logits(model.hidden(jnp.asarray(x)), dtype=jnp.float32)
        mask = (y != IGNORE).astype(np.float32)
        loss = cross_entropy(logits, jnp.maximum(jnp.asarray(y), 0), mask)[0]
        return loss, ((jnp.argmax(logits, -1) == y) & (y != IGNORE)).sum(-1)

    wants, right = jax.jit(zoology)(states["params"])
    got = np.concatenate([np.asarray(hits(states, *g)) for g in groups], axis=1)
    np.testing.assert_array_equal(got, np.asarray(right))
    _, losses = step(states, jnp.asarray([1e-3, 1e-3]), groups)  # the loss before the update
    np.testing.assert_allclose(np.asarray(losses), np.asarray(wants), rtol=1e-5)


def test_cells_side_by_side_equal_the_sweep_and_continue(tmp_path):
    """launch.mqar --side_by_side=2: each (arch, width) cell its own process, merged into --out;
    the cells equal the same sweep in one process, and the same command again keeps the
    finished cells (each cell's console follows on)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = SweepSpec(
        archs=("transformer", "gdn"), seeds=(0,), **{**TINY, "warmup_steps": SweepSpec.warmup_steps}
    )
    cmd = [
        sys.executable,
        "-m",
        "launch.mqar",
        "--side_by_side=2",
        "--archs=transformer,gdn",
        "--widths=32",
        "--settings=16:2,32:4",
        "--vocab=64",
        "--heads=4",
        "--steps=4",
        "--batch_size=8",
        "--lrs=3e-3",
        "--seeds=0",
        "--eval_examples=8",
        "--dtype=float32",
        f"--out={tmp_path / 'sbs'}",
    ]
    for _ in range(2):
        run = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "2 of 2 cells" in run.stdout and "transformer d=32: exit 0" in run.stdout
    console = (tmp_path / "sbs" / "cells" / "gdn_32.console.log").read_text()
    assert console.count("MQAR sweep:") == 2 and "results.json already" in console
    merged = json.loads((tmp_path / "sbs" / "results.json").read_text())
    want = mqar_sweep.sweep(spec, tmp_path / "one", log=lambda s: None)
    key = lambda c: (c["arch"], c["width"], c["seq_len"])
    for a, b in zip(sorted(merged["cells"], key=key), sorted(want, key=key)):
        assert key(a) == key(b) and a["accuracies"] == b["accuracies"]
    one = json.loads((tmp_path / "one" / "results.json").read_text())["rows"]
    assert len(merged["rows"]) == len(one) == 4
    for a, b in zip(sorted(merged["rows"], key=key), sorted(one, key=key)):
        assert key(a) == key(b) and a["right"] == b["right"]
        assert a["final_loss"] == pytest.approx(b["final_loss"], rel=1e-6)  # trained alike
    assert sorted(merged["merged_from"]) == sorted(
        str(tmp_path / "sbs" / "cells" / c) for c in ("transformer_32", "gdn_32")
    )


def test_a_signal_to_the_side_by_side_command_reaches_every_cell(tmp_path):
    """SIGTERM to `launch.mqar --side_by_side=2` while both cells train: each cell saves its
    trials and stops, the command names what did not finish and exits 1."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "sbs"
    cmd = [
        sys.executable,
        "-m",
        "launch.mqar",
        "--side_by_side=2",
        "--archs=transformer",
        "--widths=32,64",
        "--settings=16:2",
        "--vocab=64",
        "--heads=4",
        "--steps=1000000",
        "--batch_size=4",
        "--lrs=3e-3",
        "--seeds=0",
        "--eval_examples=4",
        "--dtype=float32",
        f"--out={out}",
    ]
    proc = subprocess.Popen(
        cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    consoles = [out / "cells" / f"transformer_{w}.console.log" for w in (32, 64)]
    deadline = time.time() + 300
    while not all(c.exists() and "[1/1]" in c.read_text() for c in consoles):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.5)
    time.sleep(2.0)  # inside the training loop
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stderr[-3000:]
    assert "2 cells did not finish (stopped by a signal)" in stderr
    for w, console in zip((32, 64), consoles):
        assert "stopped by SIGTERM at step" in console.read_text()
        assert (out / "cells" / f"transformer_{w}" / f"partial_transformer_{w}.npz").exists()


def test_zoology_mode_is_zoologys_figure_2_set_up(tmp_path):
    """--mode=zoology: Zoology's values by default (four settings, each its own models at its
    own batch, 64 epochs of 100,000 examples, four learning rates 1e-4..1e-2, 3,000 test
    examples, no MLP, attention one head with learned positions, GDN two heads); its data a
    fixed set, each epoch a permutation of it, with zeros (no noise tokens) between the queries;
    and a tiny sweep trains one cell per (arch, width, setting) and writes their rows."""
    import numpy as np

    from hwh_jax.layers.config import LayerSpec

    z = mqar_spec.zoology_spec()
    assert z.lrs == pytest.approx(tuple(np.logspace(-4, -2, 4)))
    assert [z.for_setting(i).batch_size for i in range(4)] == [512, 512, 256, 128]
    assert z.for_setting(3).steps == 64 * (100_000 // 128) and z.eval_examples == 3_000
    t, g, h = (mqar_spec.sweep_config(a, 64, z) for a in ("transformer", "gdn", "hwh"))
    assert t.layers == (LayerSpec(1, 0),) * 2 and t.head_dim == 64 and t.abs_positions == 512
    assert g.layers == (LayerSpec(0, 2),) * 2 and g.la_key_dim == 32 and g.abs_positions == 0
    assert h.layers == (LayerSpec(1, 1),) * 2 and h.abs_positions == 0
    assert t.mlp_hidden == g.mlp_hidden == h.mlp_hidden == 0
    with pytest.raises(ValueError, match="--archs: 'layerwise'"):
        mqar_spec.zoology_spec(archs=("layerwise",)).validate()

    spec = mqar_spec.zoology_spec(
        archs=("transformer",),
        widths=(16,),
        settings=((16, 2), (32, 4)),
        vocab=64,
        train_examples=48,
        epochs=2,
        batch_size=16,
        lrs=(3e-3,),
        seeds=(0,),
        eval_examples=8,
        dtype="float32",
    )
    one = spec.for_setting(0)
    assert one.steps == 2 * 3 and one.settings == ((16, 2),)
    batches = [mqar_data.train_batch(one, s)[0] for s in range(one.steps)]
    epochs = [sorted(tuple(r) for x, _, _ in batches[e * 3 : e * 3 + 3] for r in x) for e in (0, 1)]
    assert epochs[0] == epochs[1] and len(set(epochs[0])) == 48  # every example once an epoch
    assert [tuple(r) for r in batches[0][0]] != [tuple(r) for r in batches[3][0]]  # reshuffled
    x, where, _ = batches[0]
    between = np.ones_like(x, bool)
    between[:, :4] = False  # the two key-value pairs
    np.put_along_axis(between, where, False, axis=1)  # the queried keys (answers follow)
    assert (x[between] == 0).all()

    lines = []
    mqar_sweep.sweep(spec, tmp_path, log=lines.append)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [(r["seq_len"], r["pairs"]) for r in saved["runs"]] == [(16, 2), (32, 4)]
    assert {(r["seq_len"], r["queries"]) for r in saved["rows"]} == {(16, 16), (32, 32)}
    assert any(
        "[2/2] transformer d=16 T=32:4: 1 seeds x 1 learning rates, 6 steps of 16" in s
        for s in lines
    )
    again = []
    mqar_sweep.sweep(spec, tmp_path, log=again.append)  # done: nothing trained again
    assert all("already" in s for s in again)
