"""``short_conv``: the public entry, which checks shapes and runs the implementation its
``ShortConvSettings`` choose; under ``kernel_mesh`` the kernels run per device shard."""

from __future__ import annotations

from kernels_pallas import dispatch, sharding
from kernels_pallas.dispatch import pow2
from kernels_pallas.short_conv.pallas import short_conv_pallas
from kernels_pallas.short_conv.reference import short_conv_reference
from kernels_pallas.short_conv.settings import ShortConvSettings


def choose(settings: ShortConvSettings, channels_per_head: int) -> str:
    """The implementation ``short_conv`` runs for heads of ``channels_per_head`` channels."""
    impl = settings.choose()
    n = channels_per_head
    if settings.impl == "auto" and impl == "pallas" and (n < 16 or not pow2(n)):
        return "reference"
    return impl


def short_conv(
    x,
    weight,
    segment_ids=None,
    *,
    heads: int = 1,
    normalize: bool = False,
    eps: float = 1e-6,
    scale: float = 1.0,
    settings: ShortConvSettings | None = None,
):
    """SiLU(causal depthwise conv(x)), optionally L2-normalised per head and scaled.

    Args:
      x: [B, T, C]; weight: [W, C] (tap i multiplies x_{t-(W-1)+i});
      segment_ids: [B, T] ints or None: no tap reaches back across a change of id;
      heads: C is ``heads`` blocks of C // heads channels (the norm's groups, and the kernel's
        per-program columns); normalize: divide each head's vector by its L2 norm (+ eps);
      scale: multiplies the normalised output (GDN's query scale);
      settings: which implementation and how it is launched (default ``ShortConvSettings()``).
    Returns: [B, T, C] in x's dtype.
    """
    settings = ShortConvSettings() if settings is None else settings
    if x.ndim != 3 or weight.ndim != 2 or weight.shape[1] != x.shape[2]:
        raise ValueError(
            f"short_conv: need x [B,T,C] and weight [W,C]; got {x.shape}, {weight.shape}"
        )
    if heads < 1 or x.shape[2] % heads:
        raise ValueError(f"short_conv: heads={heads} does not divide the {x.shape[2]} channels")
    if segment_ids is not None and segment_ids.shape != x.shape[:2]:
        raise ValueError(
            f"short_conv: segment_ids must be [B,T]={x.shape[:2]}, got {segment_ids.shape}"
        )
    if scale != 1.0 and not normalize:
        raise ValueError(
            f"short_conv: scale={scale} multiplies the normalised output; pass normalize=True"
        )
    impl = dispatch.record(settings, choose(settings, x.shape[2] // heads))
    kw = dict(heads=heads, normalize=normalize, eps=eps, scale=float(scale))
    if impl == "reference":
        return short_conv_reference(x, weight, segment_ids, **kw)
    km = sharding.current()
    if km is None:
        return short_conv_pallas(x, weight, segment_ids, settings=settings, **kw)
    b, h = km.batch_spec(x.shape[0]), km.head_spec(heads)
    local_heads = heads // (km.mesh.shape[h] if h else 1)

    def local(x, weight, seg=None):
        return short_conv_pallas(x, weight, seg, settings=settings, **{**kw, "heads": local_heads})

    args, specs = [x, weight], [sharding.P(b, None, h), sharding.P(None, h)]
    if segment_ids is not None:
        args.append(segment_ids)
        specs.append(sharding.P(b, None))
    return sharding.per_shard(local, km, tuple(specs), sharding.P(b, None, h))(*args)
