"""Named remat policies (``model.remat``, hwh_jax/layers/remat.py): every policy trains the
losses of no rematerialisation, and keeps less than it in the compiled step's temporary memory
(the CPU's memory analysis). Offload is refused on a CPU with a line naming the key."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from hwh_jax.layers import remat
from hwh_jax.layers.config import LayerSpec, ModelConfig
from hwh_jax.models import HybridLM, model_config


def _train(policy):
    cfg = ModelConfig(  # two head-wise layers, small enough to compile six times quickly
        vocab_size=128,
        d_model=64,
        num_heads=4,
        head_dim=16,
        la_key_dim=16,
        la_value_dim=16,
        mlp_hidden=128,
        layers=(LayerSpec(1, 3), LayerSpec(2, 2), LayerSpec(1, 3)),
        dtype="float32",
        la_chunk_size=16,
        remat=policy,
    )
    graphdef, params = nnx.split(HybridLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    tx = optax.adamw(1e-3)
    opt = tx.init(params)
    batch = jnp.asarray(np.random.default_rng(0).integers(1, 128, (8, 129)), jnp.int32)

    def step(params, opt):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(batch[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

        loss, g = jax.value_and_grad(loss_fn)(params)
        updates, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    compiled = jax.jit(step).lower(params, opt).compile()
    losses = []
    for _ in range(3):
        params, opt, loss = compiled(params, opt)
        losses.append(float(loss))
    return losses, compiled.memory_analysis().temp_size_in_bytes


def test_every_policy_trains_the_same_losses_in_no_more_memory():
    runs = {p: _train(p) for p in remat.POLICIES if p != "offload"}
    for p, (losses, _) in runs.items():
        np.testing.assert_allclose(losses, runs["none"][0], rtol=1e-6, err_msg=p)
    # On the CPU at this size the block's backward workspace dominates the step's temporary
    # memory, and the kept activations are a few percent of it: every policy keeps less than
    # none, and those that keep fewer products (all but save_dots) less than save_dots;
    # between the last four the CPU's analysis differs by under 1% (docs/training.md).
    memory = {p: m for p, (_, m) in runs.items()}
    assert all(memory[p] < memory["none"] for p in memory if p != "none"), memory
    fewer = ("save_dots_except_mlp", "save_qkv_proj", "minimal", "full")
    assert all(memory[p] < memory["save_dots"] for p in fewer), memory
    assert remat.policy("block") is remat.policy("full")  # the earlier name
    with pytest.raises(ValueError, match="model.remat='offload' .* choose model.remat='full'"):
        _train("offload")
    with pytest.raises(ValueError, match="ModelConfig.remat must be one of"):
        model_config("hwh", "tiny", remat="most")
