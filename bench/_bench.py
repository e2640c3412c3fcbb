"""Small helpers shared by the bench scripts (run as ``python bench/<script>.py``)."""

from __future__ import annotations

import ast
import json
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from hwh_jax.profiling import profile


def device_info() -> dict:
    """What runs a bench: the device's kind and the JAX version."""
    return {"device": jax.devices()[0].device_kind, "jax": jax.__version__}


def print_device() -> None:
    """The JSON line every bench output starts with: device kind, JAX version, XLA_FLAGS."""
    print(json.dumps({**device_info(), "xla_flags": os.environ.get("XLA_FLAGS", "")}), flush=True)


def is_oom(e: Exception) -> bool:
    """Whether an exception from XLA is an out-of-memory (it comes as several types)."""
    return "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e)


def emit(rows: list, row: dict) -> None:
    """Keep a result row and print it as a JSON line."""
    rows.append(row)
    print(json.dumps(row), flush=True)


def write_jsonl(path: str, rows: list[dict]) -> None:
    if path:
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


def literal(value: str):
    """A command-line value as a Python literal where it parses as one, else the string."""
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def parse_overrides(items) -> dict:
    """--override FIELD=VALUE ... -> {FIELD: literal(VALUE)} (ModelConfig fields; a kernel
    op's setting as OP.SETTING=VALUE, e.g. gdn.impl=chunk_reference -> {"gdn": {"impl": ...}})."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--override wants FIELD=VALUE, got {item!r}")
        field, _, setting = key.partition(".")
        if setting:
            out.setdefault(field, {})[setting] = literal(value)
        else:
            out[key] = literal(value)
    return out


def parse_impl(spec: str) -> tuple[str, dict]:
    """An --impls entry: "pallas:block_v=32,fp32_dots=ieee" -> ("pallas", {"block_v": 32,
    "fp32_dots": "ieee"}), each value a Python literal where it parses as one, else a string."""
    name, _, rest = spec.partition(":")
    opts = {}
    for item in filter(None, rest.split(",")):
        key, sep, val = item.partition("=")
        if not sep:
            raise ValueError(f"--impls {spec!r}: options are KEY=VALUE, got {item!r}")
        opts[key] = literal(val)
    return name, opts


def rel_err(a, b) -> float:
    """|a - b| / |b| (Euclidean norms over all elements, in float64)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def median_ms(fn, *args, warmup=3, reps=20) -> float:
    """Median wall time (ms) of ``fn(*args)`` waited for, after ``warmup`` calls."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def forward_backward(fwd):
    """fwd's forward+backward as one function of (*inputs, cotangent) returning (output,
    *gradients): the output is returned, not dropped, since an unused output would let XLA drop
    the kernels that form it, which training runs (and fla's timings include)."""

    def fwd_bwd(*args):
        *inputs, cotangent = args
        out, vjp = jax.vjp(fwd, *inputs)
        return (out, *vjp(cotangent.astype(out.dtype)))

    return fwd_bwd


def fwd_bwd_row(
    fwd, fwd_bwd, inputs, cotangent, want_out, want_grads, names, out="o", reps=20
) -> dict:
    """Timing and accuracy of an op: fwd(*inputs) and fwd_bwd(*inputs, cotangent) medians (ms),
    and the relative error of the output and of each input's gradient (``names``) against a
    reference's (``want_out``, ``want_grads``); ``fwd_bwd`` as ``forward_backward`` makes it."""
    return {
        "fwd_ms": median_ms(fwd, *inputs, reps=reps),
        "fwd_bwd_ms": median_ms(fwd_bwd, *inputs, cotangent, reps=reps),
        "err": {
            out: rel_err(fwd(*inputs), want_out),
            **{
                f"d{n}": rel_err(a, b)
                for n, a, b in zip(names, fwd_bwd(*inputs, cotangent)[1:], want_grads)
            },
        },
    }


def _traced(fn, args, reps, **summarize_kw) -> dict:
    """``profile.summarize`` of ``reps`` calls of ``fn(*args)`` queued back to back, after one
    call waited for."""
    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as d:
        with profile.capture(d):
            for _ in range(reps):
                out = fn(*args)
            jax.block_until_ready(out)
        return profile.summarize(d, steps=reps, **summarize_kw)


def device_ms(fn, *args, reps=20):
    """(device time per call in ms, its kernels) of ``fn(*args)`` from a profiler trace of
    ``reps`` calls: the sum of the kernels' durations, without the per-call launch and host
    overhead that wall-clock medians of small ops are made of. (None, []) without device events
    (the CPU backend)."""
    s = _traced(fn, args, reps)
    if not s["top_kernels_ms"]:
        return None, []
    return s["kernel_ms"], s["top_kernels_ms"]


def device_profile(fn, *args, reps=10, top=12) -> dict:
    """``profile.summarize`` of ``reps`` calls of ``fn(*args)``, each kernel named with the
    source line it came from (its compiled HLO), printed as ``format_summary`` does; {} without
    device events (the CPU backend). ``fn``: compiled (``jax.jit(f).lower(...).compile()``, its
    HLO read as it is) or jitted (compiled once more for its HLO)."""
    hlo = fn.as_text() if hasattr(fn, "as_text") else fn.lower(*args).compile().as_text()
    s = _traced(fn, args, reps, top=top, hlo_text=hlo)
    if not s["top_kernels_ms"]:
        return {}
    print(profile.format_summary(s), flush=True)
    return s


def device_times(fwd, fwd_bwd, fwd_args, fwd_bwd_args) -> dict:
    """A row's device times: "profile" (``device_profile`` of the forward and of
    forward+backward) and ``fwd_device_ms`` / ``fwd_bwd_device_ms``, first kernel start to last
    kernel end per call of calls queued back to back (launch gaps in, as fla's CUDA-event
    timings, the host's dispatch out); only "profile", empty, without device events (CPU)."""
    prof = {
        "fwd": device_profile(fwd, *fwd_args),
        "fwd_bwd": device_profile(fwd_bwd, *fwd_bwd_args),
    }
    row = {"profile": prof}
    for part, p in prof.items():
        if p:
            row[f"{part}_device_ms"] = p["span_ms"]
    return row


def limit_ms(flops: float, nbytes: float, ceil: dict) -> float:
    """The fastest a call of ``flops`` FLOPs that must move ``nbytes`` bytes can run on a device
    of ``ceilings()`` ``ceil``: the longer of the two at its measured rates (ms)."""
    return max(flops / ceil["matmul_tflops"], nbytes / ceil["copy_tbps"]) / 1e9


def ceilings() -> dict:
    """This device's rates measured now: a bf16 8192^3 matmul (TFLOP/s) and a device-to-device
    copy counting read + write (TB/s). Machines of one kind differ by several percent: rows timed
    on different machines compare through these."""
    a = jax.random.normal(jax.random.key(0), (8192, 8192), jnp.bfloat16)
    mm = jax.jit(lambda x, y: x @ y)
    t = median_ms(mm, a, a, reps=10)
    x = jax.random.normal(jax.random.key(1), (1 << 30,), jnp.bfloat16)  # 2 GiB
    cp = jax.jit(lambda x: x * 1)
    tc = median_ms(cp, x, reps=10)
    return {"matmul_tflops": 2 * 8192**3 / t / 1e9, "copy_tbps": 2 * x.nbytes / tc / 1e9}


def attention_inputs(B, T, H, G, D, documents, seed=0):
    """bf16 q [B, T, H, D], k and v [B, T, G, D], a cotangent like q, and with ``documents``
    segment ids [B, T]: 3 + b documents in row b, cut at uneven places (None without)."""
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (B, T, H, D), jnp.bfloat16)
    k = jax.random.normal(ks[1], (B, T, G, D), jnp.bfloat16)
    v = jax.random.normal(ks[2], (B, T, G, D), jnp.bfloat16)
    do = jax.random.normal(ks[3], (B, T, H, D), jnp.bfloat16)
    seg = (jnp.arange(T)[None] * (3 + jnp.arange(B)[:, None]) // T) if documents else None
    return q, k, v, do, seg
