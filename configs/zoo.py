r"""Named architectures of the efficient-mixer studies, at any size (default ``small``):

  --config=configs/zoo.py:pure,KIND[,SIZE]               every head a KIND linear head
  --config=configs/zoo.py:layerwise,KIND,R[,SIZE]        R KIND layers : 1 RoPE FA layer
  --config=configs/zoo.py:layerwise_nope,KIND,R[,SIZE]   the same with NoPE FA layers
  --config=configs/zoo.py:hwh,KIND[,SIZE]                HwH's allocation, KIND linear heads
  --config=configs/zoo.py:hwh_rope,KIND[,SIZE]           the same with RoPE FA heads
  --config=configs/zoo.py:swa,W[,SIZE]                   3 RoPE sliding-window layers of W
                                                         tokens : 1 RoPE FA layer
  --config=configs/zoo.py:swa_nope,W[,SIZE]              the same with NoPE FA layers

KIND is a ``model.la_kind`` (gdn, deltanet, lightning, retnet, mamba2, gla, hgrn, hgrn2;
docs/models.md). The systematic analysis of hybrid linear attention compares each kind pure
and layer-wise at LA:FA 24:1, 12:1, 6:1 and 3:1 (R = 24 needs a size of at least 25 layers:
the config says so otherwise); the study of efficient attention in hybrids sweeps SWA windows
from 128 to 4,096 with RoPE or NoPE FA layers. Parameters are matched to the Transformer's
through the MLP as for every architecture. Anything else is overridden on the command line as
in any config (``--config.train.steps=...``).
"""

from configs import base
from hwh_jax.layers import heads
from hwh_jax.models.variants import SIZES

FORMS = {
    "pure": "gdn",
    "layerwise": "layerwise",
    "layerwise_nope": "layerwise_nope",
    "hwh": "hwh",
    "hwh_rope": "hwh_rope",
    "swa": "swa",
    "swa_nope": "swa_nope",
}


def get_config(arg: str = "pure,gdn"):
    form, *rest = arg.split(",")
    if form not in FORMS:
        raise ValueError(f"configs/zoo.py:{arg}: {form!r} is not one of {list(FORMS)}")
    want = 2 if form.startswith("layerwise") else 1  # values before the optional size
    if len(rest) not in (want, want + 1):
        raise ValueError(
            f"configs/zoo.py:{arg}: {form} takes {want} value(s) then an "
            f"optional size (the module docstring)"
        )
    size = rest[want] if len(rest) > want else "small"
    if size not in SIZES:
        raise ValueError(f"configs/zoo.py:{arg}: size {size!r} is not one of {list(SIZES)}")
    config = base.get_config(f"{FORMS[form]}_{size}")
    config.unlock()
    m = config.model
    if form.startswith("swa"):
        m.window = _positive(rest[0], "the window W", arg)
    else:
        if rest[0] not in heads.names():
            raise ValueError(
                f"configs/zoo.py:{arg}: linear-head kind {rest[0]!r} is not one of {list(heads.names())}"
            )
        m.la_kind = rest[0]
        if form.startswith("layerwise"):
            m.ratio = (1, _positive(rest[1], "the ratio R", arg))
    config.lock()
    return config


def _positive(text: str, what: str, arg: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"configs/zoo.py:{arg}: {what} must be a positive integer, got {text!r}")
    return value
