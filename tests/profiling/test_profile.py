"""hwh_jax.profiling.profile: device time by kernel from a Perfetto trace."""

import gzip
import json

import jax
import jax.numpy as jnp
import pytest

from hwh_jax.profiling import profile


def _write_trace(root, events):
    d = root / "plugins" / "profile" / "run1"
    d.mkdir(parents=True)
    meta = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
    ]
    with gzip.open(d / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": meta + events}, f)


def test_summarize_sums_device_kernels_by_name_and_category(tmp_path):
    ev = lambda pid, name, ts, dur: {
        "ph": "X",
        "pid": pid,
        "tid": 7,
        "name": name,
        "ts": ts,
        "dur": dur,
    }
    _write_trace(
        tmp_path,
        [
            ev(1, "gdn_wy_bwd", 0, 400),
            ev(1, "gdn_wy_bwd", 1000, 400),  # 2 steps
            ev(1, "nvjet_tst_128x256_gemm", 300, 200),  # overlaps 100
            ev(1, "cudnn_generated_fort_native_sdpa", 2000, 600),
            ev(1, "loop_add_fusion", 3000, 100),
            ev(1, "short_conv_bwd", 3100, 40),  # no gap
            ev(2, "PjitFunction(step)", 0, 99999),  # host: ignored
        ],
    )
    s = profile.summarize(tmp_path, steps=2)
    assert s["kernel_ms"] == pytest.approx((800 + 200 + 600 + 100 + 40) / 1e3 / 2)
    assert s["busy_ms"] == pytest.approx((500 + 400 + 600 + 100 + 40) / 1e3 / 2)  # union
    assert s["by_category_ms"] == pytest.approx(
        {"gdn": 0.4, "attention": 0.3, "matmul": 0.1, "fusion/other": 0.05, "short_conv": 0.02}
    )
    assert s["top_kernels_ms"][0] == {
        "name": "gdn_wy_bwd",
        "category": "gdn",
        "ms": 0.4,
        "launches": 1.0,
    }
    assert s["kernels_per_step"] == 3.0
    # idle: 500 us after the matmul (ends 500, next 1000), 600 after the second gdn_wy_bwd,
    # 400 after the attention kernel; the host event is not a kernel.
    assert s["idle_between_kernels_ms"] == pytest.approx(1.5 / 2)
    assert [g["name"] for g in s["gaps_after"]] == [
        "gdn_wy_bwd",
        "nvjet_tst_128x256_gemm",
        "cudnn_generated_fort_native_sdpa",
    ]
    assert s["gaps_after"][0]["ms"] == pytest.approx(0.3) and s["gaps_after"][0]["count"] == 0.5
    assert s["span_ms"] == pytest.approx(3.14 / 2)  # 0 .. 3140 us over 2 steps
    assert [(g["name"], g["ms"], g["at_ms"]) for g in s["longest_gaps"]] == [
        ("gdn_wy_bwd", pytest.approx(0.6), pytest.approx(1.4)),
        ("nvjet_tst_128x256_gemm", pytest.approx(0.5), pytest.approx(0.5)),
        ("cudnn_generated_fort_native_sdpa", pytest.approx(0.4), pytest.approx(2.6)),
    ]
    text = profile.format_summary(s, step_ms=1.0)
    assert "82% busy" in text and "gdn_wy_bwd" in text and "idle between them 0.75" in text
    assert "first kernel to last 1.57 ms per step" in text and "0.600 ms at      1.40" in text


def test_kernels_name_their_source_from_the_hlo_metadata(tmp_path):
    def my_layer(x):
        return jnp.tanh(x * 3.0).sum(-1)

    text = jax.jit(my_layer).lower(jnp.ones((8, 8))).compile().as_text()
    src = profile.hlo_sources(text)
    assert any("tanh" in v and "my_layer" in v for v in src.values()), src
    name = next(k for k, v in src.items() if "tanh" in v)
    ev = {"ph": "X", "pid": 1, "tid": 7, "name": name, "ts": 0, "dur": 10}
    _write_trace(tmp_path, [ev])
    s = profile.summarize(tmp_path, steps=1, hlo_text=text)
    assert "tanh" in s["top_kernels_ms"][0]["source"]
    [(where, ms)] = s["by_source_ms"].items()
    assert "my_layer" in where and ms == pytest.approx(0.01)
    assert "<- " in profile.format_summary(s)
    # XLA's compiled module: the fusion reads x [8, 8] and writes the sums [8], fp32
    assert 8 * 8 * 4 + 8 * 4 in profile.hlo_bytes(text).values()


def test_one_kernel_serving_two_products_is_two_rows_each_with_its_source(tmp_path):
    # cuBLAS runs one kernel (same name) for different products: keyed by name only, both would
    # be charged to whichever source came first; two layers' copies of one product (mlp.2 and
    # mlp.3, the same operation and line) stay one row.
    text = """HloModule m

ENTRY %main (x: f32[8,8]) -> f32[8,8] {
  %x = f32[8,8]{1,0} parameter(0)
  %head.1 = f32[8,8]{1,0} custom-call(%x, %x), custom_call_target="__cublas$gemm", metadata={op_name="jit(f)/dot_general" source_file="/m/lm.py" source_line=10}
  %mlp.2 = f32[8,8]{1,0} custom-call(%head.1, %x), custom_call_target="__cublas$gemm", metadata={op_name="jit(f)/transpose" source_file="/m/mlp.py" source_line=20}
  ROOT %mlp.3 = f32[8,8]{1,0} custom-call(%mlp.2, %x), custom_call_target="__cublas$gemm", metadata={op_name="jit(f)/transpose" source_file="/m/mlp.py" source_line=20}
}
"""
    ev = lambda ts, dur, op: {
        "ph": "X",
        "pid": 1,
        "tid": 7,
        "name": "nvjet_176x128_TNN",
        "ts": ts,
        "dur": dur,
        "args": {"hlo_op": op},
    }
    _write_trace(tmp_path, [ev(0, 300, "head.1"), ev(300, 100, "mlp.2"), ev(400, 100, "mlp.3")])
    s = profile.summarize(tmp_path, steps=1, hlo_text=text)
    rows = {r["source"]: (r["ms"], r["launches"]) for r in s["top_kernels_ms"]}
    assert rows == {
        "jit(f)/dot_general @ lm.py:10": (0.3, 1.0),
        "jit(f)/transpose @ mlp.py:20": (0.2, 2.0),
    }
    assert s["by_source_ms"] == pytest.approx({"lm.py:10": 0.3, "mlp.py:20": 0.2})
    assert s["by_category_ms"] == pytest.approx({"matmul": 0.5})
    # each product names two f32[8,8] operands and one output: 768 bytes a launch
    head = next(r for r in s["top_kernels_ms"] if r["source"].endswith("lm.py:10"))
    assert head["mb_per_launch"] == pytest.approx(768e-6)
    assert head["tb_per_s"] == pytest.approx(768 / 0.3 / 1e9)


def test_hlo_bytes_counts_operands_and_every_output_of_a_fusion():
    text = """HloModule m

%fused (p0: bf16[4,6], p1: f32[6]) -> (bf16[4,6], f32[4]) {
  %p0 = bf16[4,6]{1,0} parameter(0)
  %p1 = f32[6]{0} parameter(1)
  %c = f32[4]{0} constant({1, 2, 3, 4})
  ROOT %t = (bf16[4,6]{1,0}, f32[4]{0}) tuple(%p0, %c)
}

ENTRY %main (a: bf16[4,6], b: f32[6]) -> (bf16[4,6], f32[4]) {
  %a = bf16[4,6]{1,0} parameter(0)
  %b = f32[6]{0} parameter(1)
  ROOT %input_reduce_fusion.7 = (bf16[4,6]{1,0}, f32[4]{0}) fusion(%a, %b), kind=kInput, calls=%fused
}
"""
    # outputs 48 + 16 bytes, operands 48 + 24; only fusions and custom calls are listed
    assert profile.hlo_bytes(text) == {"input_reduce_fusion_7": 136}


def test_capture_writes_a_trace_that_summarize_reads(tmp_path):
    f = jax.jit(lambda x: jnp.tanh(x @ x).sum())
    x = jnp.ones((64, 64))
    f(x).block_until_ready()
    with profile.capture(tmp_path / "p"):
        f(x).block_until_ready()
    s = profile.summarize(tmp_path / "p", steps=1)  # CPU: no device events
    assert s["steps"] == 1 and s["kernel_ms"] >= 0
    with pytest.raises(FileNotFoundError, match="capture"):
        profile.summarize(tmp_path / "none", steps=1)
    with pytest.raises(ValueError, match="steps"):
        profile.summarize(tmp_path / "p", steps=0)


def test_a_fusion_without_metadata_takes_its_fused_computations():
    text = """HloModule m

%fused_computation (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %tanh.0 = f32[8]{0} tanh(%p), metadata={op_name="jit(f)/tanh" source_file="/a/b.py" source_line=7}
}

ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  ROOT %loop_tanh_fusion.3 = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused_computation
}
"""
    src = profile.hlo_sources(text)
    assert src["loop_tanh_fusion_3"] == "jit(f)/tanh @ b.py:7"


def test_the_linear_attention_kernels_have_a_category_of_their_own():
    assert profile.category("gdn_scan_fwd") == "gdn"
    for name in (
        "linear_scan_fwd",
        "linear_scan_out",
        "linear_state_grads",
        "linear_score_grads",
        "gla_scan_bwd",
        "gla_intra_fwd",
        "gla_values_grad",
        "hgrn_fwd",
        "hgrn_bwd_summary",
    ):
        assert profile.category(name) == "linear_attention", name
    assert profile.category("loop_add_fusion") == "fusion/other"


def test_the_models_parts_group_the_device_time():
    """Every part of ``OP_GROUPS`` the model names (jax.named_scope) is found in a tiny HwH
    training step's compiled program, so a profile groups its kernels by part."""
    import optax
    from flax import nnx

    from hwh_jax.models import HybridLM, model_config
    from hwh_jax.training.steps import make_train_step

    cfg = model_config("hwh", "tiny", dtype="float32")
    graphdef, params = nnx.split(HybridLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    tx = optax.adamw(1e-3)
    state = {
        "params": params,
        "opt_state": tx.init(params),
        "step": jnp.zeros((), jnp.int32),
        "rng": jax.random.key(0),
        "bad_step": jnp.full((), -1, jnp.int32),
    }
    B, T = 2, 32
    batch = {
        "inputs": jnp.ones((B, T), jnp.int32),
        "targets": jnp.ones((B, T), jnp.int32),
        "segment_ids": jnp.ones((B, T), jnp.int32),
        "positions": jnp.tile(jnp.arange(T), (B, 1)),
        "loss_mask": jnp.ones((B, T), jnp.float32),
    }
    step = make_train_step(graphdef, tx, lambda s: 1e-3)
    text = jax.jit(step).lower(state, batch).compile().as_text()
    groups = {profile.op_group(name, src) for name, src in profile.hlo_sources(text).items()}
    want = {g for g, _, scope in profile.OP_GROUPS if scope}
    assert want <= groups, want - groups
    # the kernels' own categories come first, whatever scope they run in
    assert profile.op_group("gdn_wy_bwd", "jit(s)/mlp/x @ f.py:1") == "linear heads: kernels"
    assert profile.op_group("loop_fusion", "jit(s)/transpose(jvp(mlp))/mul @ mlp.py:3") == "MLP"
    assert profile.op_group("loop_fusion", "jit(s)/mul @ mlp.py:3") == "other"  # a file is no scope
