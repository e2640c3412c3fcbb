r"""What a sequence mesh axis costs each device in compute, and its kernels' accuracy, on one
accelerator.

  python bench/sequence_split.py --tokens 8192 32768 --out sequence_split.jsonl
  python bench/sequence_split.py --tokens 128 --interpret     # the kernels interpreted on a CPU

With the time dimension split over a ``sequence`` axis, each device runs a linear recurrence's
per-shard worker (``kernels_pallas.time_shards``): the gated delta rule scans V + K value
columns instead of V and adds the received state's term to its outputs; the decays and HGRN's
gates add that term from a cumulative decay. This script runs the worker on a one-device mesh
whose ``sequence`` axis has size 1, given an incoming (initial) state, which is the work a
device of a longer axis does on its T tokens beside the plain op on the same tokens (the
all-gather of the shards' states is not in it: one device). For each op and T: forward+backward
medians (ms) of both, their ratio, and the relative error of the worker's outputs and input
gradients (bf16 inputs) against the plain op's in fp32 with the jnp chunked form.
Rows: B = 1, H = 16, K = V = 128 (HwH-1.4B's linear heads); HGRN with D = 2048.
"""

from __future__ import annotations

import argparse

import _bench
import jax
import jax.numpy as jnp
import numpy as np
from _bench import forward_backward, median_ms, rel_err

from kernels_pallas import sharding
from kernels_pallas.decay_attention import DecaySettings, decay_attention
from kernels_pallas.decay_attention import op as decay_op
from kernels_pallas.gated_recurrence import GatedRecurrenceSettings, gated_recurrence
from kernels_pallas.gated_recurrence import op as recurrence_op
from kernels_pallas.gdn import GDNSettings, gated_delta_rule, gated_delta_rule_pallas
from kernels_pallas.gdn.sequence import over_shards

H, K = 16, 128


def _head_by_head(fn, axes):
    """``fn`` run one head at a time (``lax.map``, each head recomputed in the backward): the
    per-key decay's fp32 chunked reference holds [T, C, C, K]-sized terms of every head at once
    (84 GiB at 32K tokens); ``axes`` is each input's head axis, the output's is 2."""

    def run(*xs):
        @jax.checkpoint
        def one(hs):
            return fn(*(jnp.expand_dims(h, a) for h, a in zip(hs, axes)))[:, :, 0]

        out = jax.lax.map(one, [jnp.moveaxis(x, a, 0) for x, a in zip(xs, axes)])
        return jnp.moveaxis(out, 0, 2)

    return run


def _mesh() -> sharding.KernelMesh:
    devices = np.asarray(jax.devices()[:1]).reshape(1, 1, 1, 1)
    mesh = jax.sharding.Mesh(devices, ("data", "fsdp", "tensor", "sequence"))
    return sharding.KernelMesh(mesh)


def _ops(T: int, dtype, interpret: bool):
    """(name, inputs, plain fn, worker fn, fp32 reference fn) per op; every fn takes the
    inputs (the initial state last) and returns the outputs."""
    ks = jax.random.split(jax.random.key(T), 8)
    q = jax.random.normal(ks[0], (1, T, H, K), dtype)
    k = jax.random.normal(ks[1], (1, T, H, K), jnp.float32)
    k = (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(dtype)
    v = jax.random.normal(ks[2], (1, T, H, K), dtype)
    g = -jax.nn.softplus(jax.random.normal(ks[3], (1, T, H))) * 0.1
    g_key = -jax.nn.softplus(jax.random.normal(ks[4], (1, T, H, K))) * 0.1
    beta = jax.nn.sigmoid(jax.random.normal(ks[5], (1, T, H)))
    h0 = jax.random.normal(ks[6], (1, H, K, K)) * 0.1
    km = _mesh()
    pallas = dict(impl="pallas", interpret=True) if interpret else {}
    gdn, ref_gdn = GDNSettings(**pallas), GDNSettings(impl="chunk_reference")
    dec, ref_dec = DecaySettings(**pallas), DecaySettings(impl="chunk_reference")

    def f32(xs):
        return [x.astype(jnp.float32) for x in xs]

    def gdn_plain(q, k, v, g, beta, h0, s=gdn):
        return gated_delta_rule(q, k, v, g, beta, initial_state=h0, settings=s)[0]

    def gdn_worker(q, k, v, g, beta, h0):
        kw = dict(initial_state=h0, output_final_state=False, settings=gdn)
        return over_shards(gated_delta_rule_pallas, km, "sequence", q, k, v, g, beta, **kw)[0]

    def decay_plain(q, k, v, g, h0, s=dec):
        return decay_attention(q, k, v, g, initial_state=h0, settings=s)[0]

    def decay_worker(q, k, v, g, h0):
        scan = (
            decay_op.decay_attention_pallas
            if g.ndim == 3
            else decay_op.decay_attention_per_key_pallas
        )
        kw = dict(scale=None, initial_state=h0, output_final_state=False, settings=dec)
        return decay_op._over_shards(scan, km, "sequence", q, k, v, g, **kw)[0]

    D = H * K
    a = jax.nn.sigmoid(jax.random.normal(ks[7], (1, T, D)) + 3.0).astype(dtype)
    b = jax.random.normal(ks[0], (1, T, D), dtype)
    c0 = jax.random.normal(ks[1], (1, D))
    rec = GatedRecurrenceSettings(**pallas)

    def hgrn_plain(a, b, h0, s=rec):
        return gated_recurrence(a, b, initial_state=h0, settings=s)[0]

    def hgrn_worker(a, b, h0):
        kw = dict(initial_state=h0, output_final_state=False, settings=rec)
        pallas = recurrence_op.gated_recurrence_pallas
        return recurrence_op._over_shards(pallas, km, "sequence", a, b, **kw)[0]

    return [
        ("gated_delta_rule", [q, k, v, g, beta, h0], gdn_plain, gdn_worker,
         lambda *xs: gdn_plain(*f32(xs), s=ref_gdn)),
        ("decay_attention (a decay per head)", [q, k, v, g, h0], decay_plain, decay_worker,
         lambda *xs: decay_plain(*f32(xs), s=ref_dec)),
        ("decay_attention (per key)", [q, k, v, g_key, h0], decay_plain, decay_worker,
         _head_by_head(lambda *xs: decay_plain(*f32(xs), s=ref_dec), (2, 2, 2, 2, 1))),
        ("gated_recurrence", [a, b, c0], hgrn_plain, hgrn_worker,
         lambda *xs: hgrn_plain(*f32(xs), s=GatedRecurrenceSettings(impl="scan"))),
    ]  # fmt: skip


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[8192, 32768])
    p.add_argument("--out", default="")
    p.add_argument("--interpret", action="store_true", help="Pallas interpreted (a CPU check)")
    args = p.parse_args()
    _bench.print_device()
    rows = []
    for T in args.tokens:
        for name, xs, plain, worker, reference in _ops(T, jnp.bfloat16, args.interpret):
            want = jax.jit(reference)(*xs)
            cot = jax.random.normal(jax.random.key(1), want.shape, want.dtype)
            want_grads = jax.jit(forward_backward(reference))(*xs, cot)[1:]
            row = {"op": name, "T": T}
            for label, fn in (("plain", plain), ("worker", worker)):
                fb = jax.jit(forward_backward(fn))
                out = fb(*xs, cot)
                row[f"{label}_fwd_bwd_ms"] = median_ms(fb, *xs, cot)
                row[f"{label}_err_o"] = rel_err(out[0], want)
                errs = [rel_err(a, b) for a, b in zip(out[1:], want_grads)]
                row[f"{label}_err_each_grad"] = errs  # in the order of the op's inputs
                row[f"{label}_err_grads"] = max(errs)
            row["ratio"] = row["worker_fwd_bwd_ms"] / row["plain_fwd_bwd_ms"]
            _bench.emit(rows, row)
    print(f"\n{'op':36s} {'T':>6s} {'plain ms':>9s} {'worker ms':>9s} {'ratio':>6s} "
          f"{'err o (plain/worker)':>22s} {'err grads (plain/worker)':>26s}")  # fmt: skip
    for r in rows:
        print(
            f"{r['op']:36s} {r['T']:6d} {r['plain_fwd_bwd_ms']:9.2f} {r['worker_fwd_bwd_ms']:9.2f} "
            f"{r['ratio']:6.2f} {r['plain_err_o']:10.2e}/{r['worker_err_o']:9.2e} "
            f"{r['plain_err_grads']:12.2e}/{r['worker_err_grads']:9.2e}"
        )
    _bench.write_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
