"""gdn at size small (see configs/base.py and hwh_jax/models/variants.py)."""

from configs import base


def get_config():
    return base.get_config("gdn_small")
