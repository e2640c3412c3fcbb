"""``gated_delta_rule``: the public entry, which checks shapes and runs the implementation its
``GDNSettings`` choose; under ``kernel_mesh`` the Pallas kernels run per device shard."""
from __future__ import annotations

import jax.numpy as jnp

from kernels_pallas import dispatch, sharding
from kernels_pallas.gdn.chunk_reference import gated_delta_rule_chunk_reference
from kernels_pallas.gdn.pallas import gated_delta_rule_pallas
from kernels_pallas.gdn.reference import gated_delta_rule_recurrent
from kernels_pallas.gdn.settings import GDNSettings


def _check_shapes(q, k, v, g, beta, initial_state):
    if q.ndim != 4:
        raise ValueError(f"gated_delta_rule: q must be [B,T,H,K], got shape {q.shape}")
    B, T, H, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"gated_delta_rule: k shape {k.shape} != q shape {q.shape}")
    if v.ndim != 4 or v.shape[:3] != (B, T, H):
        raise ValueError(f"gated_delta_rule: v must be [B={B},T={T},H={H},V], got {v.shape}")
    for name, x in (("g", g), ("beta", beta)):
        if x is not None and x.shape != (B, T, H):
            raise ValueError(f"gated_delta_rule: {name} must be [B,T,H]={(B, T, H)}, got {x.shape}")
    if initial_state is not None and initial_state.shape != (B, H, K, v.shape[-1]):
        raise ValueError(f"gated_delta_rule: initial_state must be [B,H,K,V]="
                         f"{(B, H, K, v.shape[-1])}, got {initial_state.shape}")


def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                     output_final_state=False, settings: GDNSettings | None = None):
    """Gated delta rule over a sequence, fla layout.

    Args:
      q, k: [B, T, H, K] (k L2-normalised by the caller); v: [B, T, H, V];
      g: [B, T, H] log decay (<= 0), or None: no decay (DeltaNet; the Pallas kernels then
        skip every exponential and the decay's gradient); beta: [B, T, H] in [0, 1];
      scale: query scale, default K**-0.5; initial_state: [B, H, K, V] (fp32);
      output_final_state: also return the state after the last token;
      settings: which implementation and how it is launched (default ``GDNSettings()``).
    Returns:
      (o [B, T, H, V] in v's dtype, final state [B, H, K, V] fp32 or None).
    """
    settings = GDNSettings() if settings is None else settings
    _check_shapes(q, k, v, g, beta, initial_state)
    impl = dispatch.record(settings, settings.choose())
    kw = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    if g is None and impl != "pallas":
        g = jnp.zeros(q.shape[:3], jnp.float32)
    if impl == "recurrent":
        return gated_delta_rule_recurrent(q, k, v, g, beta, **kw)
    if impl == "chunk_reference":
        return gated_delta_rule_chunk_reference(q, k, v, g, beta,
                                                chunk_size=settings.chunk_size, **kw)
    km = sharding.current()
    if km is None:
        return gated_delta_rule_pallas(q, k, v, g, beta, settings=settings, **kw)
    return _pallas_per_shard(km, q, k, v, g, beta, settings=settings, **kw)


def _pallas_per_shard(km, q, k, v, g, beta, *, initial_state, output_final_state, **kw):
    """The Pallas kernels on each device's rows and heads (``kernels_pallas.sharding``)."""
    b, h = km.batch_spec(q.shape[0]), km.head_spec(q.shape[2])
    x4, x3, st = sharding.P(b, None, h, None), sharding.P(b, None, h), sharding.P(b, h, None, None)
    named = {"q": (q, x4), "k": (k, x4), "v": (v, x4), "g": (g, x3), "beta": (beta, x3),
             "initial_state": (initial_state, st)}
    names = [n for n, (x, _) in named.items() if x is not None]   # g None: no decay

    def local(*args):
        a = dict(zip(names, args))
        o, s = gated_delta_rule_pallas(a["q"], a["k"], a["v"], a.get("g"), a["beta"],
                                       initial_state=a.get("initial_state"),
                                       output_final_state=output_final_state, **kw)
        return (o, s) if output_final_state else o

    args, specs = [named[n][0] for n in names], [named[n][1] for n in names]
    out = sharding.per_shard(local, km, tuple(specs), (x4, st) if output_final_state else x4)(
        *args)
    return out if output_final_state else (out, None)
