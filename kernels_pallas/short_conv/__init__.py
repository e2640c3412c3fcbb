"""The GDN heads' short causal convolution with its SiLU and (for q, k) per-head L2 norm.

Implementations:
  reference  ``reference.py``: jnp, the specification (XLA fuses it as it likes).
  pallas     ``pallas.py``: one Triton kernel forward, one backward (custom_vjp); GPU, or
             ``interpret=True`` anywhere.
``impl="auto"`` picks per backend (``AUTO_IMPL``; TPU takes the reference: no Mosaic layout yet),
and the reference where the kernels cannot run (channels per head not a power of two >= 16).
"""
from __future__ import annotations

from kernels_pallas import dispatch, sharding
from kernels_pallas.short_conv.pallas import short_conv_pallas
from kernels_pallas.short_conv.reference import (causal_conv1d, doc_offsets, l2_normalize,
                                                 short_conv_reference, silu_norm)

IMPLS = ("auto", "reference", "pallas")
AUTO_IMPL = {"gpu": "pallas"}


def resolve_impl(impl: str = "auto", channels_per_head: int | None = None) -> str:
    """The implementation ``short_conv(impl=impl)`` runs on this backend for heads of
    ``channels_per_head`` channels."""
    dispatch.check_impl("short_conv", impl, IMPLS)
    if impl != "auto":
        return impl
    choice = AUTO_IMPL.get(dispatch.backend(), "reference")
    n = channels_per_head
    if choice == "pallas" and n is not None and (n < 16 or n & (n - 1)):
        return "reference"
    return choice


def short_conv(x, weight, segment_ids=None, *, heads: int = 1, normalize: bool = False,
               eps: float = 1e-6, scale: float = 1.0, impl: str = "auto", interpret=False):
    """SiLU(causal depthwise conv(x)), optionally L2-normalised per head.

    Args:
      x: [B, T, C]; weight: [W, C] (tap i multiplies x_{t-(W-1)+i});
      segment_ids: [B, T] ints or None: no tap reaches back across a change of id;
      heads: C is ``heads`` blocks of C // heads channels (the norm's groups, and the kernel's
        per-program columns); normalize: divide each head's vector by its L2 norm (+ eps).
      impl: "auto" | "reference" | "pallas"; interpret: run "pallas" in the generic interpreter.
    Returns: [B, T, C] in x's dtype.
    """
    if x.ndim != 3 or weight.ndim != 2 or weight.shape[1] != x.shape[2]:
        raise ValueError(f"short_conv: need x [B,T,C] and weight [W,C]; got {x.shape}, "
                         f"{weight.shape}")
    if heads < 1 or x.shape[2] % heads:
        raise ValueError(f"short_conv: heads={heads} does not divide the {x.shape[2]} channels")
    if segment_ids is not None and segment_ids.shape != x.shape[:2]:
        raise ValueError(f"short_conv: segment_ids must be [B,T]={x.shape[:2]}, got "
                         f"{segment_ids.shape}")
    if scale != 1.0 and not normalize:
        raise ValueError(f"short_conv: scale={scale} multiplies the normalised output; "
                         f"pass normalize=True")
    impl = dispatch.record("short_conv", resolve_impl(impl, x.shape[2] // heads))
    kw = dict(heads=heads, normalize=normalize, eps=eps, scale=float(scale))
    if impl == "reference":
        return short_conv_reference(x, weight, segment_ids, **kw)
    km = sharding.current()
    if km is None:
        return short_conv_pallas(x, weight, segment_ids, interpret=interpret, **kw)
    b, h = km.batch_spec(x.shape[0]), km.head_spec(heads)
    local_heads = heads // (km.mesh.shape[h] if h else 1)

    def local(x, weight, seg=None):
        return short_conv_pallas(x, weight, seg, interpret=interpret,
                                 **{**kw, "heads": local_heads})

    args, specs = [x, weight], [sharding.P(b, None, h), sharding.P(None, h)]
    if segment_ids is not None:
        args.append(segment_ids)
        specs.append(sharding.P(b, None))
    return sharding.per_shard(local, km, tuple(specs), sharding.P(b, None, h))(*args)


__all__ = ["short_conv", "short_conv_pallas", "short_conv_reference", "causal_conv1d",
           "doc_offsets", "l2_normalize", "silu_norm", "resolve_impl", "IMPLS", "AUTO_IMPL"]
