"""The benchmark scripts run end to end on the CPU at the tiny size with their profile path: a
script that breaks (a name error in ``--profile``, say) fails here, not on a GPU machine."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, script, *args, profile=True):
    """(rows, stdout) of ``bench/script`` on the CPU, its profile (a trace folder) on unless
    ``profile`` is False."""
    out = tmp_path / "rows.jsonl"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    prof = ["--profile", str(tmp_path / "prof")] if profile else []
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args, *prof, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()], proc.stdout


# The Transformer in these smoke tests of the benchmarks' code (their rows, timing and profile):
# it compiles fastest, and what is timed does not change what the code around it does.
def test_decode_bench_rows_and_profile(tmp_path):
    rows, stdout = _run(
        tmp_path,
        "decode.py",
        "--archs",
        "transformer",
        "--size",
        "tiny",
        "--contexts",
        "128",
        "--batches",
        "1",
        "--decode_steps",
        "3",
        "--short_steps",
        "1",
        "--decode_reps",
        "3",
        "--memory_bandwidth",
        "1e11",
    )
    (row,) = rows
    assert (row["arch"], row["context"], row["batch"]) == ("transformer", 128, 1)
    assert len(row["decode_ms_runs"]) == 3
    assert row["decode_ms"] == statistics.median(row["decode_ms_runs"])
    assert row["prefill_s"] > 0 and row["cache_gib"] > 0
    assert row["floor_ms"] == pytest.approx(1e3 * row["step_bytes"]["total"] / 1e11)
    assert row["x_floor"] == pytest.approx(row["decode_ms"] / row["floor_ms"])
    # the two loops' totals are the fixed cost plus the marginal cost per token
    short = statistics.median(row["decode_short_ms_runs"])
    for steps, per_step in ((3, row["decode_ms"]), (1, short)):
        assert steps * per_step == pytest.approx(row["loop_fixed_ms"] + steps * row["token_ms"])
    reused = statistics.median(row["decode_short_reused_ms_runs"])
    assert reused == pytest.approx(row["loop_fixed_reused_ms"] + row["token_ms"])
    assert len(row["decode_reused_ms_runs"]) == 3 and row["decode_reused_ms"] > 0
    assert row["profile"]["steps"] == 3
    assert "decode ms/token" in stdout and "x floor" in stdout and "loop fixed" in stdout


def test_train_step_bench_rows_and_profile(tmp_path):
    rows, stdout = _run(
        tmp_path,
        "train_step.py",
        "--archs",
        "transformer",
        "--sizes",
        "tiny",
        "--contexts",
        "128",
        "--steps",
        "2",
        "--tokens_per_step",
        "256",
        "--profile_steps",
        "2",
    )
    (row,) = rows
    assert (row["arch"], row["T"], row["B"]) == ("transformer", 128, 2)
    assert row["tokens_per_s"] > 0 and row["flops_per_token"] > 0
    assert row["loss"] == row["loss"]  # finite, not NaN
    assert row["step_ms"] == pytest.approx(statistics.median(row["step_ms_runs"]), abs=0.01)
    assert len(row["waited_ms"]) == 2 and [len(c) for c in row["call_ms"]] == [2, 2, 2]
    assert row["profile"]["steps"] == 2
    assert "tok/s" in stdout
    assert 0 < row["batch_unigram_entropy"] < row["first_loss"]  # 2 steps: nothing learnt yet


def test_memorize_bench_tells_memorising_from_a_leak(tmp_path):
    """A fixed batch of independent tokens learnt by heart: its loss falls far below the
    batch's unigram entropy while a batch never seen scores no better than chance; fresh
    batches every step stay near the distribution's entropy."""
    rows, stdout = _run(
        tmp_path,
        "memorize.py",
        *("--archs", "hwh", "--size", "tiny", "--seq_len", "64", "--batch", "2"),
        *("--steps", "40", "--lr", "3e-3"),
        profile=False,
    )
    (row,) = rows
    unigram = row["cond_entropy"]["0"]
    assert row["fixed_losses"][-1] < unigram - 2
    assert row["fixed_unseen_loss"] > row["zipf_entropy"]  # nothing general was learnt
    assert row["fresh_losses"][-1] > row["zipf_entropy"] - 0.5
    assert "H(x|prev)" in stdout


def test_gated_recurrence_bench_rows(tmp_path):
    rows, _ = _run(
        tmp_path,
        "gated_recurrence.py",
        "--shapes",
        "2,64,32",
        "--impls",
        "scan",
        "pallas:interpret=True,chunk_size=16,block_d=16",
        "--recurrent",
        "--reps",
        "2",
        "--profile",
        profile=False,
    )  # its --profile is a flag
    assert [r["impl"] for r in rows] == [
        "scan",
        "pallas:interpret=True,chunk_size=16,block_d=16",
        "recurrent",
    ]
    for r in rows:  # bf16 inputs against the fp32 recurrence
        assert r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 and max(r["err"].values()) < 1e-2
        # --profile: the CPU has no device events, so the profiles are empty and no device time
        assert r["profile"] == {"fwd": {}, "fwd_bwd": {}} and "fwd_device_ms" not in r


def test_short_conv_bench_rows(tmp_path):
    """A "pallas:KEY=VALUE" entry reaches ``ShortConvSettings``: block_t=16 on 32 tokens runs two
    tiles (the edge branch and the rest), interpreted, against the fp32 reference."""
    rows, _ = _run(
        tmp_path,
        "short_conv.py",
        "--shapes",
        "1,32,32,2",
        "--impls",
        "reference",
        "pallas:interpret=True,block_t=16",
        "--reps",
        "2",
        profile=False,
    )
    assert [(r["impl"], r["normalize"]) for r in rows] == [
        ("reference", True),
        ("pallas:interpret=True,block_t=16", True),
        ("reference", False),
        ("pallas:interpret=True,block_t=16", False),
    ]
    for r in rows:  # bf16 inputs against the fp32 reference
        assert r["fwd_ms"] > 0 and max(r["rel_err"].values()) < 2e-2


def _triton_regs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("triton_regs", ROOT / "bench" / "triton_regs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(
    not _triton_regs().supported(),
    reason="jaxlib > 0.10.2 compiles Triton IR at lowering (needs a GPU)",
)
def test_triton_regs_keeps_each_kernels_triton_ir_on_cpu():
    """bench/triton_regs.py's half that needs no Triton package: the ops lowered for CUDA on
    this CPU, each Pallas kernel's Triton IR kept with its launch's warps (JAX internals it
    reads would break this first)."""
    mod = _triton_regs()
    got = mod.kernels("short_conv")
    assert [(name, warps) for name, warps, _ in got] == [
        ("short_conv_fwd", 4),
        ("short_conv_bwd", 4),
        ("short_conv_dx", 4),
    ]
    assert all(ir.startswith(f"module @{name}") and "tt.func" in ir for name, _, ir in got)
    assert jax.default_backend() == "cpu"  # restored after tracing as a GPU
    got = mod.kernels("softmax_xent")  # the loss kernel: one launch, 4 warps
    assert [(name, warps) for name, warps, _ in got] == [("softmax_xent", 4)]
    assert "scf.for" in got[0][2]  # the row's chunks as loops, not unrolled


def test_head_loss_bench_rows(tmp_path):
    """bench/head_loss.py (the LM head + loss bench) end to end on the CPU: a row per
    impl, the one-op loss agreeing with autodiff through the logits."""
    out = tmp_path / "rows.jsonl"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "head_loss.py"),
            "--shapes",
            "256,32,400",
            "--impls",
            "unfused",
            "reference",
            "pallas:block_v=64,interpret=True",
            "--reps",
            "1",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["impl"] for r in rows] == ["unfused", "reference", "pallas:block_v=64,interpret=True"]
    for r in rows[1:]:
        assert max(r["rel_err"].values()) < 1e-2, r["rel_err"]
        assert r["ms"] > 0 and r["device_ms"] is None  # no device trace on a CPU


def test_bench_option_parsing():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import _bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert _bench.parse_impl("pallas:block_v=32,fp32_dots=ieee,interpret=True") == (
        "pallas",
        {"block_v": 32, "fp32_dots": "ieee", "interpret": True},
    )
    assert _bench.parse_impl("reference") == ("reference", {})
    assert _bench.parse_overrides(
        ["loss_impl=auto", "la_chunk_size=32", "gdn.impl=pallas", "gdn.block_v=32"]
    ) == {"loss_impl": "auto", "la_chunk_size": 32, "gdn": {"impl": "pallas", "block_v": 32}}
    with pytest.raises(ValueError, match="KEY=VALUE, got 'block_v'"):
        _bench.parse_impl("pallas:block_v")
    with pytest.raises(ValueError, match="FIELD=VALUE, got 'loss_impl'"):
        _bench.parse_overrides(["loss_impl"])


@pytest.mark.parametrize("script", ["decay_attention", "gdn", "gated_recurrence"])
def test_mixer_benches_forward_backward_returns_the_output(script, monkeypatch):
    """Each mixer bench's timed forward+backward returns the forward's output before the
    gradients: were the output unused, XLA could drop the kernels that form it (the decay ops
    form it in a kernel of its own), which training runs and fla's timings include."""
    import importlib

    import jax.numpy as jnp

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    mod = importlib.import_module(script)
    key = jax.random.split(jax.random.key(0), 6)
    if script == "gated_recurrence":
        fwd, fwd_bwd = mod.fns("scan")
        args = [
            jax.nn.sigmoid(jax.random.normal(key[0], (1, 32, 8))),
            jax.random.normal(key[1], (1, 32, 8)),
        ]
    else:
        fwd, fwd_bwd = mod.fns("chunk_reference")
        args = [jax.random.normal(k, (1, 32, 2, 8)) for k in key[:3]]
        args.append(jax.nn.log_sigmoid(jax.random.normal(key[3], (1, 32, 2)) + 3.0))
        if script == "gdn":
            args.append(jax.nn.sigmoid(jax.random.normal(key[4], (1, 32, 2))))
    out = fwd(*args)
    got = fwd_bwd(*args, jax.random.normal(key[5], out.shape))
    assert len(got) == len(args) + 1
    assert jnp.allclose(got[0], out, atol=1e-5)
    assert [g.shape for g in got[1:]] == [a.shape for a in args]


def test_skinny_matmul_bench_rows(tmp_path):
    """Each (impl, rows, kind) a row over the model's layers; the kernel (interpreted) gives XLA's
    products."""
    rows, stdout = _run(
        tmp_path,
        "skinny_matmul.py",
        "--size",
        "tiny",
        "--rows",
        "1",
        "2",
        "--impls",
        "xla",
        "pallas:block_n=32",
        "--kinds",
        "o",
        "step",
        "--reps",
        "1",
        "--interpret",
    )
    layers = 4  # HwH-tiny
    assert [(r["impl"], r["rows"], r["kind"], r["products"]) for r in rows] == [
        (impl, n, kind, layers * (4 if kind == "step" else 1))
        for impl in ("xla", "pallas:block_n=32")
        for n in (1, 2)
        for kind in ("o", "step")
    ]
    assert all(r["rel_err"] < 1e-2 and r["ms"] > 0 and r["weight_bytes"] > 0 for r in rows)
    assert "us each" in stdout


def test_step_parts_projection_rows(tmp_path):
    """bench/step_parts.py's projection parts on the CPU, one run: both forms of one HwH
    layer's FA heads, and the layer's nine input projections (HwH-380m with 2 FA heads: FA 3 x
    128, GDN q, k, v, b, a, gate) under two groupings, give the same outputs and x's gradient
    up to bf16 sums in another order."""
    rows, _ = _run(
        tmp_path,
        "step_parts.py",
        *("--tokens", "256", "--seq", "256", "--parts", "fa_qkv", "mixer_in", "--fa_heads", "2"),
        *("--groupings", "none", "wide"),
        profile=False,
    )
    fa, mixer = rows[:2], rows[2:]
    assert [(r["variant"], r["fa_heads"]) for r in fa] == [
        ("three_products", 2),
        ("one_product", 2),
    ]
    out_diff, dx_diff = fa[1]["rel_diff"]
    assert out_diff < 1e-2 and 0 < dx_diff < 1e-2  # one product sums dx in another order
    assert fa[0]["rel_diff"] == [0.0, 0.0] and fa[0]["fwd_bwd_ms"] > 0
    assert [r["variant"] for r in mixer] == ["none", "wide"]
    assert all(r["widths"] == [128] * 3 + [896] * 3 + [14, 14, 896] for r in mixer)
    assert mixer[0]["rel_diff"] == [0.0, 0.0]
    assert mixer[1]["rel_diff"][0] < 1e-2 and 0 < mixer[1]["rel_diff"][1] < 1e-2


def test_causality_verdict_calls_a_gradient_under_default_gpu_ops_inconclusive(monkeypatch):
    """bench/causality.py's summary: a model row failing only its gradient check, under XLA's
    default (non-deterministic) GPU ops, is inconclusive; any forward path failing, or the
    gradient under --deterministic, is not as expected."""
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    causality = importlib.import_module("causality")
    ok, bad = {"causal": True}, {"causal": False}
    grad = {"causal": False, "before_p": 1e-9, "rerun": 1e-7}
    row = {"model": "hwh", "plain": ok, "train_fwd": ok, "prefill": ok, "grad": grad}
    assert causality.verdict(row, deterministic=False).startswith("INCONCLUSIVE")
    assert causality.verdict(row, deterministic=True) == "NOT AS EXPECTED:"
    assert causality.verdict({**row, "prefill": bad}, False) == "NOT AS EXPECTED:"
    assert causality.verdict({"kernel": "short_conv", "grad": grad}, False) == "NOT AS EXPECTED:"
    assert causality.verdict({**row, "error": "grad: out of memory"}, False).startswith(
        "NOT CHECKED"
    )
    # the stages run initialisation first whatever the order asked; trained needs steps
    assert causality.stage_order(["trained", "init"], 50) == ["init", "trained"]
    with pytest.raises(ValueError, match="--trained_steps > 0"):
        causality.stage_order(["trained"], 0)


def test_causality_table_grades_each_point_by_its_best_row_and_lists_a_leak(monkeypatch):
    """bench/causality_table.py: a point's gradient takes the best of its rows (a deterministic
    rerun settles an inconclusive one), the embedding's rounding is told apart from other
    leaves', a failing deterministic row is reported NOT CAUSAL whatever else the point has,
    unchecked points are counted for every model of the matrix, and a point left inconclusive is
    listed as still to run."""
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    t = importlib.import_module("causality_table")
    fwd = {k: {"before_p": 0.0, "causal": True} for k in t.FWD}
    det = "--xla_gpu_exclude_nondeterministic_ops=true"

    def row(stage, B, T, moved, causal, leaf="['blocks'][0]['w']", flags="", rerun=0.0, **kw):
        g = {"before_p": moved, "causal": causal, "worst_leaf": leaf, "rerun": rerun}
        p = {"size": "small", "model": "hwh", "stage": stage, "B": B, "T": T, "xla_flags": flags}
        return {**p, **fwd, "grad": {**g, "leaf_rerun": 0.0}, **kw}

    rows = [
        row("init", 1, 2048, 0.0, True),
        row("init", 1, 8192, 1e-5, False, rerun=1e-3),  # default ops: inconclusive ...
        row("init", 1, 8192, 0.0, True, flags=det),  # ... then bit-identical under determinism
        row("init", 8, 2048, 1e-9, True, leaf="['embed']['embedding']", flags=det),
        row("init", 8, 8192, 1e-9, True, flags=det),  # within the floor, not the embedding
        row("trained", 1, 2048, 1e-5, False, rerun=1e-3),
        row("trained", 1, 8192, 1e-3, False, flags=det),  # a leak
        row("trained", 1, 8192, 0.0, True, flags=det),
    ]
    rows.append({**row("trained", 8, 2048, 0.0, True), "plain": {"before_p": 1.0, "causal": False}})
    entries = {(e["size"], e["model"]): e for e in t.table(rows)}
    e = entries[("small", "hwh")]
    assert e["forward"] == 6  # 7 points have rows; the failing plain forward is not bit-exact
    assert (e["identical"], e["embedding"], e["tolerance"], e["inconclusive"]) == (4, 1, 1, 1)
    assert e["not_causal"] == ["gradient ('trained', 1, 8192)", "forward ('trained', 8, 2048)"]
    assert "gradient ('trained', 8, 8192)" in e["missing"]
    assert e["undecided"] == ["gradient ('trained', 1, 2048) inconclusive"]  # left to run
    assert len(entries[("1b4", "hwh_gla")]["missing"]) == 8 + 4  # no rows: every point
    assert "NOT CAUSAL" in t.markdown([e])


def test_causality_table_counts_the_forward_paths_of_rows_older_than_the_leaf_reruns(monkeypatch):
    """A row whose gradient predates the per-leaf rerun level still counts its forward paths;
    its gradient is not graded (the point stays missing there)."""
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    t = importlib.import_module("causality_table")
    fwd = {k: {"before_p": 0.0, "causal": True} for k in t.FWD}
    old = {"before_p": 0.0, "causal": True, "rerun": 0.0}  # no leaf_rerun, no worst_leaf
    row = {"size": "small", "model": "gdn", "stage": "init", "B": 1, "T": 2048, **fwd}
    (e,) = [
        e for e in t.table([{**row, "grad": old}]) if e["model"] == "gdn" and e["size"] == "small"
    ]
    assert e["forward"] == 1 and e["identical"] == 0
    assert "gradient ('init', 1, 2048)" in e["missing"]
