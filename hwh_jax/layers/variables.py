"""How the layers declare their variables.

``partitioned(init, names)``: an initializer whose parameters carry logical axis names as
metadata only. The trainer maps the names onto a mesh through one rules table
(``hwh_jax.training.sharding``); Flax >= 0.12 would otherwise shard each annotated variable
eagerly at creation and demand a mesh even on one CPU.

``data(x)``: marks an attribute that may be None as a (possibly absent) submodule: Flax >= 0.12
treats an attribute first assigned None as static.
"""

from flax import nnx

data = getattr(nnx, "data", lambda value: value)


def partitioned(init, names: tuple):
    """``init`` with logical axis ``names`` attached to the parameters it creates."""
    return nnx.with_partitioning(init, names, eager_sharding=False)
