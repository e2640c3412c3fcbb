"""Registers per thread of this project's Triton kernels, on a machine without a GPU.

An SM of an H100/H200 has 65,536 registers: a kernel of 4 warps at 161 registers a thread fits
3 programs on an SM (18.75% occupancy), at 72 it fits 7. Nsight Compute reads this on a GPU;
this script reads it offline, so a kernel change can be judged for it before a GPU is used.

It lowers the op for CUDA on the CPU (``lower(lowering_platforms=("cuda",))``, the backend
reported as "gpu" while tracing so that the ops take their Triton path), keeps each Pallas
kernel's Triton IR, compiles it with the ``triton`` package for sm_90 and reads ptxas's report.
The figures come from that Triton and ptxas, not jaxlib's, and can differ from a GPU's by a few
registers. Needs ``pip install triton`` (not a
dependency of the project); reads internals of JAX's Pallas Triton lowering (jaxlib <= 0.10.2,
what pip gives on the project's CPU machines).

  python bench/triton_regs.py --ops short_conv gdn delta_rule softmax_xent decay decay_key hgrn \
      [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import tempfile

import jax
import jax.numpy as jnp

from kernels_pallas import compat

B, T, H, D = 32, 2048, 13, 64  # one 13-head GDN layer of HwH-380m at 2K


def _short_conv(normalize):
    from kernels_pallas.short_conv import short_conv_pallas

    def f(x, w, dy):
        y, vjp = jax.vjp(lambda x, w: short_conv_pallas(x, w, heads=H, normalize=normalize), x, w)
        return y, *vjp(dy)

    x = jax.ShapeDtypeStruct((B, T, H * D), jnp.bfloat16)
    return f, (x, jax.ShapeDtypeStruct((4, H * D), jnp.float32), x)


def _gdn(decay=True):
    """GDN's kernels; without ``decay`` DeltaNet's (g None)."""
    from kernels_pallas.gdn.pallas import gated_delta_rule_pallas

    def f(q, k, v, g, beta, do):
        g = g if decay else None
        o, vjp = jax.vjp(
            lambda q, k, v, beta: gated_delta_rule_pallas(q, k, v, g, beta)[0], q, k, v, beta
        )
        return o, *vjp(do)

    x = jax.ShapeDtypeStruct((B, T, H, D), jnp.bfloat16)
    gate = jax.ShapeDtypeStruct((B, T, H), jnp.float32)
    return f, (x, x, x, gate, gate, x)


def _decay(per_key):
    from kernels_pallas.decay_attention import DecaySettings, decay_attention

    settings = DecaySettings(impl="pallas")

    def f(q, k, v, g, do):
        o, vjp = jax.vjp(lambda *a: decay_attention(*a, settings=settings)[0], q, k, v, g)
        return o, *vjp(do)

    x = jax.ShapeDtypeStruct((8, 2048, 16, 128), jnp.bfloat16)  # the mixers' benchmark shape
    gate = jax.ShapeDtypeStruct(x.shape if per_key else x.shape[:3], jnp.float32)
    return f, (x, x, x, gate, x)


def _hgrn():
    from kernels_pallas.gated_recurrence import GatedRecurrenceSettings, gated_recurrence

    settings = GatedRecurrenceSettings(impl="pallas")

    def f(a, b, do):
        h, vjp = jax.vjp(lambda a, b: gated_recurrence(a, b, settings=settings)[0], a, b)
        return h, *vjp(do)

    x = jax.ShapeDtypeStruct((8, 2048, 2048), jnp.bfloat16)  # HGRN's benchmark shape
    return f, (x, x, jax.ShapeDtypeStruct(x.shape, jnp.float32))


def _softmax_xent():
    from kernels_pallas.softmax_xent import softmax_xent_pallas

    n, v = 44 * 2048, 50304  # the 2K step's logits at 44 sequences, GPT-2's vocabulary
    rows = jax.ShapeDtypeStruct((n,), jnp.float32)
    return (
        softmax_xent_pallas,
        (
            jax.ShapeDtypeStruct((n, v), jnp.bfloat16),
            jax.ShapeDtypeStruct((n,), jnp.int32),
            rows,
            rows,
        ),
    )


OPS = {
    "short_conv": lambda: _short_conv(True),
    "short_conv_nonorm": lambda: _short_conv(False),
    "gdn": _gdn,
    "delta_rule": lambda: _gdn(False),
    "softmax_xent": _softmax_xent,
    "decay": lambda: _decay(False),
    "decay_key": lambda: _decay(True),
    "hgrn": _hgrn,
}


@contextlib.contextmanager
def _as_gpu():
    """Trace as if on a GPU and keep every Triton module lowered meanwhile."""
    lowering = compat.triton_lowering()
    if lowering is None:
        raise RuntimeError(f"JAX {jax.__version__} has no Pallas Triton lowering module to read")
    modules, orig, backend = [], lowering.lower_jaxpr_to_triton_module, jax.default_backend

    def keep(*args, **kwargs):
        result = orig(*args, **kwargs)
        modules.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    lowering.lower_jaxpr_to_triton_module, jax.default_backend = keep, lambda: "gpu"
    try:
        yield modules
    finally:
        lowering.lower_jaxpr_to_triton_module, jax.default_backend = orig, backend


def supported() -> bool:
    """Whether this jaxlib lowers Pallas for Triton without compiling (jaxlib <= 0.10.2 keeps
    the Triton IR in its custom call; later ones compile it with their own Triton at lowering,
    which needs a GPU)."""
    return compat.jaxlib_version() <= (0, 10, 2)


def kernels(op: str):
    """[(name, num_warps, TTIR text)] of the Pallas kernels in ``op``'s forward + backward."""
    if not supported():
        raise RuntimeError(
            f"bench/triton_regs.py reads the Triton IR that jaxlib <= 0.10.2 "
            f"keeps in its custom call; this is jaxlib {jax.lib.__version__}"
        )
    f, args = OPS[op]()
    with _as_gpu() as modules:
        text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    calls = re.findall(r'name = "(\w+)", num_stages = \d+ : i32, num_warps = (\d+) : i32', text)
    names = [re.match(r"module @(\w+)", m).group(1) for m in modules]
    by_name = dict(calls)
    return [(n, int(by_name[n]), m) for n, m in zip(names, modules)]


def registers(ttir: str, num_warps: int, workdir: str) -> tuple[int, int, int]:
    """(registers per thread, spill bytes, layout conversions) of one kernel compiled for
    sm_90a; the conversions are the ``convert_layout`` ops of its TTGIR (each one a round trip
    through shared memory or shuffles, often behind a barrier; a loop's body counts once)."""
    import triton
    from triton.backends.compiler import GPUTarget

    path = os.path.join(workdir, "k.ttir")
    with open(path, "w") as fh:
        fh.write(ttir)
    compiled = triton.compile(
        path, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": 1}
    )
    with open(path + ".ptx", "w") as fh:
        fh.write(compiled.asm["ptx"])
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    ptxas = next(
        p
        for p in (os.path.join(bindir, n) for n in ("ptxas-blackwell", "ptxas"))
        if os.path.exists(p)
    )
    out = subprocess.run(
        [ptxas, "-v", "--gpu-name=sm_90a", path + ".ptx", "-o", os.devnull],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spill = int(re.search(r"(\d+) bytes spill stores", out).group(1))
    return regs, spill, compiled.asm["ttgir"].count("ttg.convert_layout")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    ap.add_argument("--out", default="", help="directory: keep each kernel's TTIR")
    args = ap.parse_args()
    print(
        f"{'op':18s} {'kernel':24s} {'warps':>5s} {'regs':>5s} {'spill B':>7s} "
        f"{'programs/SM':>11s} {'conversions':>11s}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for op in args.ops:
            for name, warps, ttir in kernels(op):
                if args.out:
                    os.makedirs(args.out, exist_ok=True)
                    with open(os.path.join(args.out, f"{op}_{name}.ttir"), "w") as fh:
                        fh.write(ttir)
                regs, spill, converts = registers(ttir, warps, tmp)
                per_sm = min(65536 // (-(-regs // 8) * 8 * 32 * warps), 64 // warps)
                print(
                    f"{op:18s} {name:24s} {warps:5d} {regs:5d} {spill:7d} {per_sm:11d} "
                    f"{converts:11d}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
