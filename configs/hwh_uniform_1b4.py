"""hwh_uniform at size 1b4 (see configs/base.py and hwh_jax/models/variants.py)."""

from configs import base


def get_config():
    return base.get_config("hwh_uniform_1b4")
