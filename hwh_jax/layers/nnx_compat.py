"""Flax NNX differences between the versions this project runs on (CPU pip vs GPU image)."""
from flax import nnx

# Flax >= 0.12 treats an attribute first assigned None as static; nnx.data marks it as a
# (possibly absent) submodule. Older Flax has no nnx.data and needs no marking.
data = getattr(nnx, "data", lambda value: value)
