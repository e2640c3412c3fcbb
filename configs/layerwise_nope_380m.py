"""layerwise_nope at size 380m (see configs/base.py and hwh_jax/models/variants.py)."""

from configs import base


def get_config():
    return base.get_config("layerwise_nope_380m")
