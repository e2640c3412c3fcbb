r"""Time parts of the training step alone: the shipped formulation beside alternatives to it.

  python bench/step_parts.py --tokens 65536 --d_model 1024 --mlp 3072 --vocab 50304 \
      --parts mlp loss --out $OUT/parts.jsonl
  python bench/step_parts.py --tokens 45056 --parts fa_qkv --fa_heads 1 3 5 --out $OUT/fa.jsonl
  python bench/step_parts.py --tokens 45056 --parts mixer_in --fa_heads 3 --out $OUT/mixer_in.jsonl

Each row: forward+backward (for the input and the parameters) of one part on bf16 activations
from fp32 parameters, as the model runs them; the device time per call from a profiler trace and
its kernels, beside this device's matmul and copy rates measured in the same run.
- ``mlp``: the SwiGLU block on [tokens, d]. ``shipped``: ``hwh_jax.layers.mlp.SwiGLU``
  (down(SiLU(gate(x)) * up(x)), autodiff); ``stacked``: gate and up as one product of their
  kernels stacked to [d, 2, H] and a hand-written backward that saves only that product;
  ``separate``: the two products and that backward.
- ``loss``: the LM head (x @ E^T, bf16 logits) and ``hwh_jax.layers.loss.cross_entropy``.
  ``shipped``: its log Z by ``jax.nn.logsumexp`` (a max pass, then a sum pass over the logits);
  ``one_pass``: log Z as one reduction of (max, sum of exp) pairs merged as online softmax does.
- ``fa_qkv``: one HwH layer's FA heads (``--fa_heads`` of them, NoPE, global, the 380m's
  widths) from the normalised input to their attention output: ``three_products``: q, k and v
  as three products (``linear.project`` without groups); ``one_product``: one product over
  their weights concatenated (``linear.project``'s group, as ``HeadwiseMixer`` runs a branch
  of at most ``FA_ONE_PRODUCT_WIDTH`` columns), split before the attention and its gradients
  joined again. At 1-5 heads the products are 64-320 columns wide, each a pass over x.
- ``mixer_in``: one HwH-380m layer's input projections (``--fa_heads`` FA heads, the rest GDN:
  FA q, k, v, GDN q, k, v, b, a, gate) forward and backward, every output given a cotangent, as
  ``linear.project`` runs them with each of ``--groupings``: ``none`` (a product each; b and a
  one, as always), ``fa`` (FA's q, k, v one: what ``HeadwiseMixer`` runs), ``fa_la_qkv`` (and
  GDN's q, k, v one), ``fa_la_qkvg`` (and GDN's q, k, v, gate one), ``wide`` (every layer but
  b and a one product).
The alternatives live here, not in the model: none of mlp's or loss's was faster
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json

import _bench
import jax
import jax.numpy as jnp
import numpy as np
from _bench import device_ms, median_ms, rel_err
from flax import nnx

from hwh_jax.layers import loss as lm_loss
from hwh_jax.layers.attention import FullAttentionHeads
from hwh_jax.layers.config import LayerSpec
from hwh_jax.layers.linear import project
from hwh_jax.layers.mixer import HeadwiseMixer
from hwh_jax.layers.mlp import SwiGLU
from hwh_jax.models import model_config

bf16, f32 = jnp.bfloat16, jnp.float32


def _swiglu_fwd(gu):
    g, u = gu[..., 0, :].astype(f32), gu[..., 1, :].astype(f32)
    return (g * jax.nn.sigmoid(g) * u).astype(gu.dtype), gu


def _swiglu_bwd(gu, dh):
    g, u = gu[..., 0, :].astype(f32), gu[..., 1, :].astype(f32)
    s = jax.nn.sigmoid(g)
    dh = dh.astype(f32)
    dg = dh * u * s * (1.0 + g * (1.0 - s))
    return (jnp.stack([dg, dh * g * s], axis=-2).astype(gu.dtype),)


swiglu = jax.custom_vjp(lambda gu: _swiglu_fwd(gu)[0])
swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


def mlp_fn(variant, module):
    graphdef, params = nnx.split(module, nnx.Param)

    def f(params, x):
        m = nnx.merge(graphdef, params)
        if variant == "shipped":
            return m(x)
        if variant == "stacked":
            w = jnp.stack([m.gate.kernel[...], m.up.kernel[...]], axis=1).astype(bf16)
            return m.down(swiglu(jnp.einsum("...d,dkh->...kh", x, w)))
        if variant == "separate":
            return m.down(swiglu(jnp.stack([m.gate(x), m.up(x)], axis=-2)))
        raise ValueError(f"unknown mlp variant {variant!r}; known: shipped, stacked, separate")

    return f, params


def hwh_380m_layer(cls, heads: int):
    """(graphdef, params) of ``cls`` (FullAttentionHeads, HeadwiseMixer) for an HwH-380m layer
    of ``heads`` FA heads and 16 - heads GDN heads, bf16 compute."""
    cfg = model_config("hwh", "380m", dtype="bfloat16")
    module = cls(cfg, LayerSpec(num_fa=heads, num_la=16 - heads), rngs=nnx.Rngs(0))
    return nnx.split(module, nnx.Param)


def fa_qkv_fn(variant, heads: int, seq: int):
    """(f(params, x [N, d]) -> the FA heads' outputs [N / seq, seq, heads * D], params)."""
    graphdef, params = hwh_380m_layer(FullAttentionHeads, heads)
    groups = {"three_products": (), "one_product": ((0, 1, 2),)}
    if variant not in groups:
        raise ValueError(f"unknown fa_qkv variant {variant!r}; known: {list(groups)}")

    def f(params, x):
        m = nnx.merge(graphdef, params)
        x = x.reshape(-1, seq, x.shape[-1])
        q, k, v = project(x, list(m.projections()), groups[variant])
        positions = jnp.broadcast_to(jnp.arange(seq), x.shape[:2])
        return m.attend(q, k, v, positions)

    return f, params


GROUPINGS = {  # mixer_in: HeadwiseMixer.input_projections()' order, FA's three first
    "none": (),
    "fa": ((0, 1, 2),),
    "fa_la_qkv": ((0, 1, 2), (3, 4, 5)),
    "fa_la_qkvg": ((0, 1, 2), (3, 4, 5, 8)),
    "wide": ((0, 1, 2, 3, 4, 5, 8),),
}


def mixer_in_fn(grouping, heads: int):
    """(f(params, x [N, d]) -> the layer's input projections, a tuple, params)."""
    if grouping not in GROUPINGS:
        raise ValueError(f"unknown mixer_in grouping {grouping!r}; known: {list(GROUPINGS)}")
    graphdef, params = hwh_380m_layer(HeadwiseMixer, heads)

    def f(params, x):
        fa, la = nnx.merge(graphdef, params).input_projections()
        return tuple(project(x, fa + la, GROUPINGS[grouping]))

    return f, params


def logsumexp_one_pass(x):
    x = x.astype(f32)

    def merge(a, b):
        (m1, s1), (m2, s2) = a, b
        e = jnp.exp(jnp.where(m1 == m2, 0.0, -jnp.abs(m1 - m2)))  # exp(smaller - larger)
        return jnp.maximum(m1, m2), jnp.where(m1 >= m2, s1 + s2 * e, s1 * e + s2)

    m, s = jax.lax.reduce((x, jnp.ones_like(x)), (f32(-jnp.inf), f32(0.0)), merge, (x.ndim - 1,))
    return m + jnp.log(s)


def loss_fn(variant):
    if variant not in ("shipped", "one_pass"):
        raise ValueError(f"unknown loss variant {variant!r}; known: shipped, one_pass")

    def f(emb, h, targets):
        logits = jnp.einsum("nd,vd->nv", h, emb.astype(bf16))
        return lm_loss.cross_entropy(logits, targets, jnp.ones(targets.shape, f32))[0]

    def g(*args):  # token_nll's forward reads jax.nn.logsumexp at trace time
        keep = jax.nn.logsumexp
        jax.nn.logsumexp = lambda x, axis: logsumexp_one_pass(x)
        try:
            return f(*args)
        finally:
            jax.nn.logsumexp = keep

    return f if variant == "shipped" else g


def fwd_bwd(f):
    @jax.jit
    def run(a, b, *rest):
        y, vjp = jax.vjp(lambda a, b: f(a, b, *rest), a, b)
        return y, vjp(jax.tree.map(jnp.ones_like, y))

    return run


def kernels_line(ks, n=6):
    return "; ".join(f"{k['name'][:48]} {k['ms']:.3f}" for k in ks[:n])


def timed_row(rows, label, run, args, fields):
    """Time ``run(*args)`` (median wall ms, device ms and kernels from a trace), keep the row
    (``fields`` and those) and print a line starting with ``label``."""
    dev, ks = device_ms(run, *args)
    row = {**fields, "fwd_bwd_ms": median_ms(run, *args), "fwd_bwd_device_ms": dev, "kernels": ks}
    _bench.emit(rows, row)
    print(f"{label} device {dev or float('nan'):.3f} ms :: {kernels_line(ks)}", flush=True)


def variant_rows(rows, part, variants, make, heads_list, x, fields):
    """A timed row per (FA heads, variant): ``make(variant, heads)`` -> (f, params); each row's
    ``rel_diff``: its output's (the largest over outputs) and x's gradient's relative difference
    from the first variant's."""
    for heads in heads_list:
        ref = None
        for v in variants:
            f, params = make(v, heads)
            run = fwd_bwd(f)
            y, (_, dx) = run(params, x)
            ys = jax.tree.leaves(y)
            ref = (ys, dx) if ref is None else ref  # the first variant's
            row = dict(part=part, variant=v, **fields, fa_heads=heads)
            if part == "mixer_in":
                row["widths"] = [int(a.shape[-1]) for a in ys]
            row["rel_diff"] = [max(map(rel_err, ys, ref[0])), rel_err(dx, ref[1])]
            timed_row(rows, f"{part} {heads} FA heads {v:14s}", run, (params, x), row)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--d_model", type=int, default=1024)
    ap.add_argument("--mlp", type=int, default=3072)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--parts", nargs="+", default=["mlp", "loss"])
    ap.add_argument("--mlp_variants", nargs="+", default=["shipped", "stacked", "separate"])
    ap.add_argument("--loss_variants", nargs="+", default=["shipped", "one_pass"])
    ap.add_argument("--fa_variants", nargs="+", default=["three_products", "one_product"])
    ap.add_argument("--fa_heads", nargs="+", type=int, default=[1, 3, 5])
    ap.add_argument("--seq", type=int, default=2048, help="fa_qkv: tokens a sequence")
    ap.add_argument("--groupings", nargs="+", default=list(GROUPINGS), help="mixer_in")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    _bench.print_device()
    ceil = _bench.ceilings() if jax.default_backend() == "gpu" else {}  # minutes on a CPU
    print(json.dumps({"ceilings": ceil}), flush=True)
    rng = np.random.default_rng(0)
    N, d, H, V = args.tokens, args.d_model, args.mlp, args.vocab
    x = jnp.asarray(rng.standard_normal((N, d)), bf16)
    rows = []
    if "mlp" in args.parts:
        module = SwiGLU(d, H, out_std=0.02, dtype=bf16, param_dtype=f32, rngs=nnx.Rngs(0))
        for v in args.mlp_variants:
            f, params = mlp_fn(v, module)
            fields = dict(part="mlp", variant=v, **ceil, tokens=N, d=d, hidden=H)
            fields["matmul_tflop"] = 6 * 3 * N * d * H / 1e12
            timed_row(rows, f"mlp  {v:9s}", fwd_bwd(f), (params, x), fields)
    if "loss" in args.parts:
        emb = jnp.asarray(0.02 * rng.standard_normal((V, d)), f32)
        targets = jnp.asarray(rng.integers(0, V, (N,)), jnp.int32)
        for v in args.loss_variants:
            run = fwd_bwd(loss_fn(v))
            y, _ = run(emb, x, targets)
            fields = dict(part="loss", variant=v, **ceil, tokens=N, d=d, vocab=V, loss=float(y))
            fields["matmul_tflop"] = 6 * N * d * V / 1e12
            timed_row(rows, f"loss {v:9s} {float(y):.5f}", run, (emb, x, targets), fields)
    if "fa_qkv" in args.parts:
        make = lambda v, heads: fa_qkv_fn(v, heads, args.seq)
        fields = dict(**ceil, tokens=N, d=d, seq=args.seq)
        variant_rows(rows, "fa_qkv", args.fa_variants, make, args.fa_heads, x, fields)
    if "mixer_in" in args.parts:
        fields = dict(**ceil, tokens=N, d=d)
        variant_rows(rows, "mixer_in", args.groupings, mixer_in_fn, args.fa_heads, x, fields)
    _bench.write_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
