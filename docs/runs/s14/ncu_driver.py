"""Runs the kernels of HwH-380m's 2K step that sit furthest below the device's rate, a few times
each, for Nsight Compute to read (next_call_ncu.sh): the short convolution of one GDN width
(forward + backward, with the norm: its forward kernel, backward kernel and XLA's dx fusion),
the GDN op at the same width (forward + backward), and a device copy of the same bytes as the
rate to compare against. Written in session 14, not run yet.

  python3 docs/runs/s14/ncu_driver.py [conv|gdn|copy ...]
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from kernels_pallas import gated_delta_rule
from kernels_pallas.short_conv import short_conv_pallas

B, T, H, D = 32, 2048, 13, 64        # a 13-head GDN layer of HwH-380m, 65,536 tokens
RUNS = 3


def conv():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(B, T, H * D)), jnp.bfloat16)
    dy = jnp.asarray(rng.normal(size=(B, T, H * D)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(4, H * D)) * 0.5, jnp.float32)
    seg = jnp.asarray(np.cumsum(rng.random((B, T)) < 1e-3, axis=1), jnp.int32)

    @jax.jit
    def f(x, w, dy):
        y, vjp = jax.vjp(lambda x, w: short_conv_pallas(x, w, seg, heads=H, normalize=True),
                         x, w)
        return y, *vjp(dy)
    return f, (x, w, dy)


def gdn():
    ks = jax.random.split(jax.random.key(0), 6)
    q, k = (jax.random.normal(kk, (B, T, H, D), jnp.bfloat16) for kk in ks[:2])
    k = (k / jnp.linalg.norm(k.astype(jnp.float32), axis=-1, keepdims=True)).astype(jnp.bfloat16)
    v = jax.random.normal(ks[2], (B, T, H, D), jnp.bfloat16)
    g = -jax.nn.softplus(jax.random.normal(ks[3], (B, T, H)))
    beta = jax.nn.sigmoid(jax.random.normal(ks[4], (B, T, H)))
    do = jax.random.normal(ks[5], (B, T, H, D), jnp.bfloat16)

    @jax.jit
    def f(q, k, v, g, beta, do):
        o, vjp = jax.vjp(lambda *a: gated_delta_rule(*a)[0], q, k, v, g, beta)
        return o, *vjp(do)
    return f, (q, k, v, g, beta, do)


def copy():
    x = jnp.ones((B, T, H * D), jnp.bfloat16)
    return jax.jit(lambda x: x * 1), (x,)


if __name__ == "__main__":
    for name in sys.argv[1:] or ["conv", "gdn", "copy"]:
        f, args = {"conv": conv, "gdn": gdn, "copy": copy}[name]()
        for _ in range(RUNS):
            jax.block_until_ready(f(*args))
        print(name, "ran", RUNS, "times", flush=True)
