"""``launch.plan``: the train step compiled by the TPU compiler for a small slice on this CPU host
(compile-only TPU devices, ``libtpu``), the plan's fields checked; a config too large for the
slice refused with the memory it needs, the chip's HBM and the remedies; slice names parsed."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwh_jax.profiling import hlo
from hwh_jax.training import tpu_slices

ROOT = Path(__file__).resolve().parents[2]


def plan(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    out = subprocess.run(
        [sys.executable, "-m", "launch.plan", f"--out={tmp_path}", *args],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return out, json.loads((tmp_path / "plan.json").read_text())


def test_the_tiny_hwh_steps_compile_for_v5e_2x2_and_fit(tmp_path):
    """The train step over the slice, its sequences split over two chips, and the prefill and
    decode steps on one of its chips."""
    out, r = plan(
        tmp_path,
        "--config=configs/hwh_tiny.py",
        "--topology=v5e:2x2",
        "--config.train.mesh=1,2,1,2",
        "--config.train.batch_size=8",
        "--inference",
        "--context=512",
        "--hlo",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (
        r["fits"]
        and r["chips"] == 4
        and r["mesh"] == {"data": 1, "fsdp": 2, "tensor": 1, "sequence": 2}
    )
    m = r["memory"]
    assert 0 < m["step_bytes"] <= m["hbm"] == 16 * 2**30
    assert m["arguments"] > 0 and m["temporaries"] > 0
    # the planner chose the whole batch (it fits) after probing the smallest micro-batch
    assert r["plan"]["micro_batch"] == 8 and r["plan"]["grad_accum"] == 1
    probed = [p[0] for p in r["plan"]["probes"]]
    assert probed == [2, 8], probed  # one row a batch shard first
    # GDN runs as its Mosaic kernels on TPU (no XLA fallback), forward and backward
    for kernel in (
        "gdn_wy_inverse",
        "gdn_wy_apply",
        "gdn_scan_fwd",
        "gdn_scan_bwd",
        "gdn_state_grads",
        "gdn_wy_bwd",
    ):
        assert r["kernels"].get(kernel, 0) >= 1, r["kernels"]
    assert r["collectives"]["all-gather"]["count"] > 0  # FSDP gathers the weights
    # over the sequence axis: the GDN shards' (state, transition) pairs gathered ([2 x 4 rows,
    # heads, K, K], the state's K x V alike), the short convolutions' halos passed on
    text = gzip.decompress((tmp_path / "train_step.hlo.txt.gz").read_bytes()).decode()
    gathered = {tuple(s) for c in hlo.collectives(text) if c.op == "all-gather" for s in c.shapes}
    assert any(len(s) == 4 and s[0] == 8 and s[2] == s[3] == 16 for s in gathered), gathered
    assert r["collectives"]["collective-permute"]["count"] > 0
    assert r["cost"]["flops"] > 0 and r["cost"]["bytes_accessed"] > 0
    e = r["estimate"]
    assert 0 < e["step_s_overlapped"] <= e["step_s_serial"]
    assert 0 < e["mfu_serial"] <= e["mfu_overlapped"] <= 1
    assert "memory per chip" in out.stdout and "estimated step" in out.stdout
    inf = r["inference"]
    assert inf["context"] == 512 and inf["prefill"]["fits"] and inf["decode"]["fits"]
    assert inf["prefill"]["kernels"].get("gdn_scan_fwd", 0) >= 1  # the chunked forward
    assert inf["decode"]["memory"]["arguments"] > 0
    assert "decode (batch 1, cache 512, one chip)" in out.stdout


def test_the_tiny_hwh_steps_compile_for_v5p_2x2x1(tmp_path):
    """A megacore chip (two TensorCores a chip, 95 GiB): the train step at a set accumulation,
    prefill and decode; the GDN kernels through Mosaic, the collectives over 4 chips."""
    out, r = plan(
        tmp_path,
        "--config=configs/hwh_tiny.py",
        "--topology=v5p:2x2x1",
        "--config.train.mesh=2,2,1",
        "--config.train.grad_accum=2",
        "--inference",
        "--context=256",
        "--batch=4",
        "--serve_mesh=2,2,1",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert r["chips"] == 4 and r["chip"]["generation"] == "v5p" and r["fits"]
    assert 0 < r["memory"]["step_bytes"] <= r["memory"]["hbm"] == int(95 * 2**30)
    assert r["plan"]["grad_accum"] == 2 and r["plan"]["how"] == "set by train.grad_accum"
    assert r["kernels"].get("gdn_scan_fwd", 0) >= 1 and r["kernels"].get("gdn_wy_bwd", 0) >= 1
    # inside the accumulation loop: the weights' gathers run once a micro-batch
    assert r["collectives"]["all-gather"]["count"] % 2 == 0
    inf = r["inference"]
    assert inf["decode"]["fits"] and inf["prefill"]["fits"]
    # served over the slice: 4 requests, one a chip; the weights over fsdp 2, gathered
    assert inf["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1, "sequence": 1}
    assert inf["decode"]["collectives"]["all-gather"]["count"] > 0
    assert inf["prefill"]["kernels"].get("gdn_scan_fwd", 0) >= 1


def test_a_config_too_large_for_the_slice_is_refused_with_what_would_fit(tmp_path):
    out, r = plan(
        tmp_path,
        "--config=configs/hwh_tiny.py",
        "--topology=v5e-4",
        "--config.train.mesh=1,4,1",
        "--config.seq_len=1048576",
        "--config.train.batch_size=4",
    )
    assert out.returncode == 3, out.stderr[-3000:]
    assert r == {
        "topology": "v5e-4",
        "fits": False,
        "arch": "hwh",
        "seq_len": 1048576,
        "mesh": [1, 4, 1],
        "error": r["error"],
    }
    message = out.stderr
    assert "does not fit" in message and "per device" in message
    assert "16.00 GiB" in message  # the chip's HBM
    assert "a larger slice" in message and "model.remat=full" in message
    assert "seq_len=1048576" in message


@pytest.mark.parametrize(
    "name,grid,chips",
    [
        ("v5p-32", (2, 2, 4), 16),
        ("v5p-16", (2, 2, 2), 8),
        ("v4-8", (2, 2, 1), 4),
        ("v5e-16", (4, 4), 16),
        ("v6e-256", (16, 16), 256),
        ("v5p:2x2x4", (2, 2, 4), 16),
        ("v5e:2x2", (2, 2), 4),
    ],
)
def test_slice_names(name, grid, chips):
    s = tpu_slices.parse(name)
    assert s.grid == grid and s.chips == chips


def test_a_slice_name_not_known_names_the_forms():
    with pytest.raises(ValueError, match="v5p-32, v5e-16"):
        tpu_slices.parse("v5x-8")
    with pytest.raises(ValueError, match="chip grid instead"):
        tpu_slices.parse("v5p-24")


def test_a_mesh_the_batch_or_the_heads_do_not_fit_is_refused_before_compiling(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.plan",
            "--config=configs/hwh_tiny.py",
            "--topology=v5e:2x2",
            "--config.train.mesh=1,2,2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))},
            "PYTHONPATH": str(ROOT),
        },
    )
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert "train.mesh=1,4,1" in last and "allow_unsplit_heads" in last
    assert "compiled the train step" not in out.stderr


def test_the_state_figures_in_docs_tpu_are_those_of_the_shardings():
    """docs/tpu.md's parameter count, AdamW state and state a chip for HwH-1.4B on mesh 4,4,1
    (16 chips of v5p-32), recomputed from the trainer's own shardings (the state's whole size,
    and the shard each chip holds)."""
    import math
    import re

    import jax

    from configs import base
    from hwh_jax.training import sharding as shd
    from hwh_jax.training.optimizer import make_optimizer
    from hwh_jax.training.specs import model_for_run, run_specs
    from hwh_jax.training.state import train_state_shardings

    config = base.get_config("hwh_1b4")
    cfg = model_for_run(config, 50257)
    tx, _ = make_optimizer(run_specs(config, data_files=False).optimizer)
    mesh = shd.make_mesh((4, 4, 1), tpu_slices.compile_only_devices(tpu_slices.parse("v5p-32")))
    _, state, sh = train_state_shardings(cfg, tx, mesh)
    leaves, shards = jax.tree.leaves(state), jax.tree.leaves(sh)
    whole = sum(x.size * x.dtype.itemsize for x in leaves)
    per_chip = sum(
        math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize for x, s in zip(leaves, shards)
    )
    params = sum(x.size for x in jax.tree.leaves(state["params"]))
    text = (ROOT / "docs" / "tpu.md").read_text()
    said = re.search(
        r"HwH-1.4B's\s+([\d,]+)\s+parameters\s+is\s+([\d.]+)\s+GiB.*?a\s+chip"
        r"\s+holds\s+([\d.]+)\s+GiB",
        text,
        re.S,
    )
    assert said, "docs/tpu.md no longer states the 1.4B state figures"
    assert int(said.group(1).replace(",", "")) == params
    assert float(said.group(2)) == round(whole / 2**30, 1)
    assert float(said.group(3)) == round(per_chip / 2**30, 2)


def test_the_sizing_table_in_docs_is_the_committed_plans():
    """Each row bench/plan_table.py renders from the plans in measurements/benchmark_rows is in
    docs/tpu.md (the sizing table) or docs/training.md (the long-context table) as rendered:
    the tables' figures are the plans'."""
    files = sorted(
        str(p)
        for p in (ROOT / "measurements" / "benchmark_rows").glob("*/plan_*_1b4_*.json")
        if not p.name.endswith("_before.json")
    )  # the code before a change
    assert files
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "plan_table.py"), *files],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    docs = "".join((ROOT / "docs" / name).read_text() for name in ("tpu.md", "training.md"))
    missing = [row for row in rows if row not in docs]
    assert not missing, missing


SFLAG_REFUSAL = (
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space "
    "sflag. Used 2.4K of 2.0K sflag. Exceeded sflag capacity by 424B."
)  # the TPU compiler's words for HwH-1.4B's step at 32K on v5p (docs/tpu.md)


def test_a_step_refused_for_sync_flags_is_compiled_again_without_multi_step_fusion():
    """The sflag refusal is answered by one more compile with
    ``compiled.WITHOUT_MULTI_STEP_FUSION``, which the caller's ``options`` then hold and the
    next compile takes at once; any other refusal is raised as it came; and the TPU compiler takes that option by its name (a
    misspelt one is refused), compiling a program for v5p 2x2x1 with it."""
    import jax

    from hwh_jax.training import compiled

    class Lowered:
        def __init__(self, error):
            self.error, self.calls = error, []

        def compile(self, compiler_options=None):
            self.calls.append(compiler_options)
            if compiler_options is None:
                raise jax.errors.JaxRuntimeError(self.error)
            return "program"

    options, lowered = {}, Lowered(SFLAG_REFUSAL)
    assert compiled.compile_lowered(lowered, options) == "program"
    assert lowered.calls == [None, compiled.WITHOUT_MULTI_STEP_FUSION]
    assert options == compiled.WITHOUT_MULTI_STEP_FUSION
    again = Lowered(SFLAG_REFUSAL)  # the planner's next compile: the options at once
    assert compiled.compile_lowered(again, options) == "program"
    assert again.calls == [compiled.WITHOUT_MULTI_STEP_FUSION]
    hbm = Lowered("RESOURCE_EXHAUSTED: 97.5G required for HLO temporaries exceeds 95.7G")
    with pytest.raises(jax.errors.JaxRuntimeError, match="HLO temporaries"):
        compiled.compile_lowered(hbm, {})
    assert hbm.calls == [None]
    probe = (
        "import jax, jax.numpy as jnp, sys\n"
        "from hwh_jax.training import compiled, tpu_slices as t\n"
        "dev = t.compile_only_devices(t.parse('v5p:2x2x1'))[0]\n"
        "x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16,"
        " sharding=jax.sharding.SingleDeviceSharding(dev))\n"
        "low = jax.jit(lambda a: a @ a).lower(x)\n"
        "low.compile(compiler_options=compiled.WITHOUT_MULTI_STEP_FUSION)\n"
        "name = next(iter(compiled.WITHOUT_MULTI_STEP_FUSION))\n"
        "try:\n"
        "    low.compile(compiler_options={name + '_misspelt': False})\n"
        "except Exception as e:\n"
        "    sys.exit(0 if 'No such compile option' in str(e) else 1)\n"
        "sys.exit(2)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT), "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
