"""The train state (params, optimizer state, step, rng, non-finite marker), its shardings on a
mesh, and the steps jitted as the trainer runs them."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
from flax import nnx

import kernels_pallas
from hwh_jax.layers.config import ModelConfig
from hwh_jax.models.lm import HybridLM
from hwh_jax.training import sharding as shd


def init_train_state(cfg: ModelConfig, tx, seed) -> dict:
    """The checkpointed train state: params, optimizer state, step, rng, non-finite marker.

    Under ``jit`` pass ``seed`` as an argument (a traced int32), not a Python constant: with a
    constant key XLA constant-folds the whole random initialisation at compile time (minutes
    for a 100M-parameter model on a GPU)."""
    key = jax.random.key(seed)
    params = nnx.state(HybridLM(cfg, rngs=nnx.Rngs(key)), nnx.Param)
    return {
        "params": params,
        "opt_state": tx.init(params),
        "step": jnp.int32(0),
        "rng": jax.random.key_data(key),
        "bad_step": jnp.int32(-1),
    }


def train_state_shardings(cfg: ModelConfig, tx, mesh):
    """(graphdef, abstract train state, its shardings) of ``cfg`` on ``mesh``: parameters by
    their logical axis names (``sharding.RULES``), optimizer moments as their parameters,
    scalars replicated."""
    graphdef, abstract_params = nnx.split(
        nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0))), nnx.Param
    )
    param_sh = shd.state_shardings(abstract_params, mesh)
    repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    abstract_state = jax.eval_shape(lambda s: init_train_state(cfg, tx, s), jnp.int32(0))
    # optimizer moments mirror the params' shardings (same tree under mu / nu)
    opt_sh = _mirror_shardings(abstract_state["opt_state"], abstract_params, param_sh, repl)
    return (
        graphdef,
        abstract_state,
        {"params": param_sh, "opt_state": opt_sh, "step": repl, "rng": repl, "bad_step": repl},
    )


def jit_step(step_fn, mesh, first_sh, **jit_kw):
    """``step_fn(first, batch)`` jitted as the trainer runs it on ``mesh``: the Pallas kernels
    per device shard (``kernel_mesh``), ``first`` (the train state, or the parameters for the
    eval step) in ``first_sh``, the batch's rows over the batch axes; ``jit_kw`` (out_shardings,
    donate_argnums) go to ``jax.jit``."""
    return jax.jit(
        kernels_pallas.kernel_mesh(mesh)(step_fn),
        in_shardings=(first_sh, shd.batch_sharding(mesh)),
        **jit_kw,
    )


@contextlib.contextmanager
def threefry_kernel():
    """Lower the threefry PRNG to its one-kernel form on GPU instead of to XLA ops (the same
    bits; no effect on other backends). The initialisation is hundreds of random draws, each
    otherwise a threefry expansion that XLA compiles into the program (minutes at 380m)."""
    before = jax.config.jax_threefry_gpu_kernel_lowering
    jax.config.update("jax_threefry_gpu_kernel_lowering", True)
    try:
        yield
    finally:
        jax.config.update("jax_threefry_gpu_kernel_lowering", before)


def _mirror_shardings(opt_state, params, param_sh, repl):
    """Shard every optimizer leaf whose path ends like a param path the way that param is;
    scalars (counts) and anything else are replicated."""
    flat_p = {_suffix(path): sh for path, sh in jax.tree_util.tree_flatten_with_path(param_sh)[0]}
    shapes = {_suffix(path): x.shape for path, x in jax.tree_util.tree_flatten_with_path(params)[0]}

    def pick(path, leaf):
        key = _suffix(path)
        for n in range(len(key), 0, -1):
            k = key[-n:]
            if k in flat_p and shapes[k] == leaf.shape:
                return flat_p[k]
        return repl

    return jax.tree_util.tree_map_with_path(pick, opt_state)


def _suffix(path):
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
