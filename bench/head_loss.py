r"""Time the LM head + training loss: autodiff through the logits against ``head_loss``.

  python bench/head_loss.py --shapes 90112,1024,50304 --impls unfused reference pallas \
      pallas:block_v=2048 pallas:num_warps=4 pallas:num_stages=2 --out results.jsonl

For each (N tokens, d, V) on bf16 h [N, d] and w [d, V]: the loss's forward + the gradients of
h and w, as the training step takes them (``steps.train_loss``'s two paths: "unfused" is
``cross_entropy(h @ w)`` by autodiff, the rest ``head_loss`` with that
``kernels_pallas.softmax_xent`` impl; "pallas:KEY=VALUE,..." sets ``SoftmaxXentSettings``
fields: block_v, num_warps, num_stages, interpret). Per row: the wall median, the device time per call from a
profiler trace and its kernels (on a GPU), the three GEMMs' share at the 8192^3 product's rate
measured beside them, the peak memory of the compiled program, and the largest relative
error of the loss and gradients against the first impl listed.
"""

from __future__ import annotations

import argparse

import _bench
import jax
import jax.numpy as jnp
import numpy as np
from _bench import device_ms, median_ms, parse_impl, rel_err

from hwh_jax.layers.loss import cross_entropy, head_loss
from kernels_pallas import SoftmaxXentSettings


def loss_fn(impl, z_loss, **kw):
    if impl == "unfused":

        def f(h, w, t, m):
            loss, zl, _ = cross_entropy(jnp.einsum("nd,dv->nv", h, w), t, m, z_loss)
            return loss + zl

        return f
    if impl in ("reference", "pallas"):
        settings = SoftmaxXentSettings(impl=impl, **kw)
        return lambda h, w, t, m: head_loss(h, w, t, m, z_loss=z_loss, settings=settings)[0]
    raise ValueError(f"unknown impl {impl!r}; known: unfused, reference, pallas[:KEY=VALUE,...]")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["90112,1024,50304"], help="N,d,V")
    ap.add_argument("--impls", nargs="+", default=["unfused", "reference", "pallas"])
    ap.add_argument("--z_loss", type=float, default=0.0)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    _bench.print_device()
    ceil = _bench.ceilings() if jax.default_backend() == "gpu" else None  # minutes on a CPU
    print(ceil, flush=True)
    rows = []
    for shape in args.shapes:
        N, D, V = map(int, shape.split(","))
        rng = np.random.default_rng(0)
        h = jnp.asarray(rng.normal(size=(N, D)), jnp.bfloat16)
        w = jnp.asarray(rng.normal(size=(D, V)) * D**-0.5, jnp.bfloat16)
        t = jnp.asarray(rng.zipf(1.2, N) % V, jnp.int32)
        m = jnp.ones((N,), jnp.float32)
        gemm_ms = 3 * 2 * N * D * V / ceil["matmul_tflops"] / 1e9 if ceil else None
        exact = None
        for spec in args.impls:
            name, kw = parse_impl(spec)
            step = jax.jit(jax.value_and_grad(loss_fn(name, args.z_loss, **kw), argnums=(0, 1)))
            out = step(h, w, t, m)
            flat = [out[0], *out[1]]
            if exact is None:
                exact = flat
            ma = step.lower(h, w, t, m).compile().memory_analysis()
            dev, kernels = device_ms(step, h, w, t, m, reps=args.reps)
            _bench.emit(
                rows,
                {
                    "shape": [N, D, V],
                    "impl": spec,
                    "z_loss": args.z_loss,
                    "ms": median_ms(step, h, w, t, m, reps=args.reps),
                    "device_ms": dev,
                    "gemm_ms_at_ceiling": gemm_ms,
                    "temp_gib": None if ma is None else ma.temp_size_in_bytes / 2**30,
                    "rel_err": {
                        k: rel_err(a, b) for k, a, b in zip(("loss", "dh", "dw"), flat, exact)
                    },
                    "kernels": kernels,
                },
            )
    ms = lambda v: f"{v:8.3f}" if v is not None else f"{'n/a':>8}"
    print(f"\n{'shape':>20} {'impl':>28} {'ms':>8} {'dev ms':>8} {'GEMMs':>8} {'temp GiB':>8}")
    for r in rows:
        print(
            f"{str(r['shape']):>20} {r['impl']:>28} {ms(r['ms'])} {ms(r['device_ms'])} "
            f"{ms(r['gemm_ms_at_ceiling'])} {ms(r['temp_gib'])}"
        )
    _bench.write_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
