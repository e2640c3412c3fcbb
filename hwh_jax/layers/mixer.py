"""The head-wise hybrid token mixer: FA heads and GDN heads side by side in one layer.

    y = W_o [ FA_1..n_fa(x) ; GDN_1..n_la(x) ]

Both branches read the same normalised input; their head outputs are concatenated and one
output projection [n_fa*D + n_la*V, d] mixes them. A layer with no FA heads (or no GDN heads)
has no such branch at all: no weights, no compute. A pure Transformer layer is n_la = 0, a pure
GDN layer n_fa = 0, a layer-wise hybrid alternates the two, HwH mixes them inside the layer.

Inference (``extend``) computes the input projections of both branches (FA: q, k, v; GDN: q, k,
v, b, a, gate) as one matmul over their weights concatenated (``input_weight``: at each call,
or once per decode loop by ``Generator``); the parameters stay separate, so checkpoints and
imports do not change. Decoding one token is a string of small kernels, and one GEMM where
there were up to nine shortens it. Training keeps one matmul per projection
(``linear.project``): fused there, the concatenated widths get slower GEMM kernels and the
output gradients have to be concatenated again (docs/benchmarks.md has both timings). The
exception is a narrow FA branch (q at most ``FA_ONE_PRODUCT_WIDTH`` wide: HwH's 1-5 heads),
whose q, k and v are one product: three products of 64-320 columns each pass over x and,
backward, write x's full-width gradient, which one product and its copies avoid (measured
against three products at 1, 3 and 5 heads: docs/benchmarks.md, "The training step").
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hwh_jax.layers import heads, remat
from hwh_jax.layers.attention import FullAttentionHeads
from hwh_jax.layers.config import LayerSpec, ModelConfig
from hwh_jax.layers.linear import INIT_STD, apply, dense, matmul, project
from hwh_jax.layers.variables import data
from kernels_pallas.sharding import constrain, current

# q's width (heads x head dim) up to which the FA branch's q, k and v are one product in
# training, from HwH-380m's layers on an H100 (docs/benchmarks.md, "The training step"): the FA
# heads alone forward and backward are faster as one product at 1, 3 and 5 heads of 64; among
# all of a layer's input projections, faster at 1 head, even at 3 and 3% slower at 5. Wider
# branches (a Transformer's 16 heads) were not measured.
FA_ONE_PRODUCT_WIDTH = 320


class HeadwiseMixer(nnx.Module):
    """One layer's token mixer: ``spec.num_fa`` FA heads and ``spec.num_la`` GDN heads side by
    side over the same input x [B, T, d] (module docstring).

    1. Project x for every head of both branches (``project``: FA q, k, v; GDN q, k, v, b, a,
       gate), each kept [B, T, width] with rows over the batch axes.
    2. FA branch: attention over its q, k, v -> [B, T, n_fa * D].
    3. GDN branch: short convolutions, gates, the gated delta rule, the gated norm
       -> [B, T, n_la * V].
    4. Concatenate the two along the last axis and apply ``o_proj`` -> [B, T, d].
    """

    def __init__(self, cfg: ModelConfig, spec: LayerSpec, *, layer: int = 0, rngs: nnx.Rngs):
        kw = dict(dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype, rngs=rngs)
        self.fa = data(None if not spec.num_fa else FullAttentionHeads(cfg, spec, rngs=rngs))
        self.la = data(  # the linear heads of cfg.la_kind (hwh_jax/layers/heads/)
            None if not spec.num_la else heads.get(cfg.la_kind).build(cfg, spec.num_la, layer, **kw)
        )
        self.dtype = cfg.compute_dtype
        self.matmul_settings = cfg.matmul_settings()
        width = spec.num_fa * cfg.head_dim + spec.num_la * cfg.la_value_dim
        self.o_proj = dense(
            width,
            cfg.d_model,
            ("heads", "embed"),
            std=INIT_STD / math.sqrt(2 * cfg.num_layers),
            **kw,
        )

    def input_projections(self):
        """The input projections of both branches, FA's first, each in its branch's order."""
        return (
            (list(self.fa.projections()) if self.fa is not None else []),
            (list(self.la.projections()) if self.la is not None else []),
        )

    def input_weight(self):
        """The input projections' weights concatenated, [d, width of all], in the compute
        dtype: what ``project(fused=True)`` multiplies by. ``Generator``'s decode loop forms
        it once before its steps instead of once a token (the concatenation is a copy of the
        weights)."""
        fa, la = self.input_projections()
        return jnp.concatenate([p.kernel[...].astype(self.dtype) for p in fa + la], axis=1)

    def project(self, x, fused: bool = False, weight=None):
        """(FA projections or None, GDN projections or None) of x [B, T, d], each a list of
        [B, T, width] in the order of the branch's ``projections()``; ``fused``: one matmul
        (``linear.matmul``) by ``weight`` (default: ``input_weight()``)."""
        fa, la = self.input_projections()
        if fused:
            w = self.input_weight() if weight is None else weight
            y = matmul(x.astype(self.dtype), w, self.matmul_settings)
            ys = jnp.split(y, np.cumsum([p.kernel.shape[1] for p in fa + la])[:-1], axis=-1)
        else:  # under a mesh: rows stay over the batch axes, heads over tensor where they divide
            heads = ([self.fa.num_heads, self.fa.num_kv, self.fa.num_kv] if fa else []) + (
                self.la.projection_heads() if la else []
            )
            ys = [constrain(y, n) for y, n in zip(project(x, fa + la, self._groups()), heads)]
        return (ys[: len(fa)] or None), (ys[len(fa) :] or None)

    def _groups(self):
        """``linear.project``'s groups: the FA q, k, v as one product where the branch is
        narrow (module docstring) and its heads are not split over a tensor axis."""
        if self.fa is None or self.fa.num_heads * self.fa.head_dim > FA_ONE_PRODUCT_WIDTH:
            return ()
        km = current()
        if km is not None and (km.head_spec(self.fa.num_heads) or km.head_spec(self.fa.num_kv)):
            return ()
        return ((0, 1, 2),)

    def __call__(self, x, positions, segment_ids=None):  # [B,T,d] -> [B,T,d]
        with jax.named_scope("projections"):  # scopes: the profile's groups (Block.residual)
            fa, la = self.project(x)
        # named for the remat policies (layers/remat.py): identities otherwise
        fa = None if fa is None else [remat.tag(y, remat.QKV) for y in fa]
        la = None if la is None else [remat.tag(y, remat.QKV) for y in la]
        outs = []
        if fa is not None:
            with jax.named_scope("fa_heads"):
                outs.append(self.fa.attend(*fa, positions, segment_ids))
        if la is not None:
            with jax.named_scope("la_heads"):
                outs.append(self.la.mix(*la, segment_ids=segment_ids, positions=positions))
        y = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=-1)
        with jax.named_scope("out_proj"):
            return remat.tag(self.o_proj(y), remat.OUT)

    # ------------------------------------------------------------ inference
    def init_cache(self, batch: int, max_len: int, dtype):
        return {
            "fa": None if self.fa is None else self.fa.init_cache(batch, max_len, dtype),
            "la": None if self.la is None else self.la.init_cache(batch, dtype),
        }

    def extend(self, x, t0, start, valid, cache, fresh: bool = False, weight=None):
        """One chunk (or token) over the cache; ``weight``: ``input_weight()`` if already
        formed."""
        fa, la = self.project(x, fused=True, weight=weight)
        outs, new = [], {"fa": None, "la": None}
        if fa is not None:
            o, new["fa"] = self.fa.extend(fa, t0, start, cache["fa"], fresh=fresh)
            outs.append(o)
        if la is not None:
            o, new["la"] = self.la.extend(la, valid, cache["la"], t0=t0, start=start)
            outs.append(o)
        y = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=-1)
        return apply(self.o_proj, y, self.matmul_settings), new
