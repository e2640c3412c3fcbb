"""How a sharded training step partitions: the collectives of its compiled program."""

import math

import jax
import jax.numpy as jnp
import pytest

from hwh_jax.models import model_config
from hwh_jax.profiling import hlo
from hwh_jax.training import sharding as shd
from hwh_jax.training import state as train_state
from hwh_jax.training.optimizer import OptimizerSpec, make_optimizer
from hwh_jax.training.steps import make_train_step


def test_collectives_reads_combined_and_single_results():
    text = """
  %a = f32[8,4]{1,0} all-gather(%p), channel_id=1, metadata={op_name="jit(f)/dot_general"}
  %b = (f32[2]{0}, /*index=1*/bf16[3,4]{1,0}) all-reduce(%x, %y), to_apply=%add
  %c = f32[] add(%d, %e)
  %s = bf16[16]{0} all-gather-start(%q)"""
    got = hlo.collectives(text)
    assert [(c.op, c.shapes, c.bytes) for c in got] == [
        ("all-gather", ((8, 4),), 128),
        ("all-reduce", ((2,), (3, 4)), 8 + 24),
        ("all-gather", ((16,),), 32),
    ]
    assert got[0].source == "jit(f)/dot_general"


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (XLA_FLAGS fakes them on CPU)")
def test_fsdp_step_gathers_weights_not_activations():
    """On an FSDP mesh the step all-gathers weights (ZeRO-3) and keeps every activation's rows
    on their own device: no collective carries the whole batch's [B, T, ...] activations. Left
    to itself GSPMD gathered them (sharding.constrain's docstring)."""
    cfg = model_config("hwh", "tiny", dtype="float32")
    B, T = 16, 64
    tx, schedule = make_optimizer(OptimizerSpec(lr=1e-3, warmup_steps=1, total_steps=10))
    mesh = shd.make_mesh((1, 8, 1))
    graphdef, state, state_sh = train_state.train_state_shardings(cfg, tx, mesh)
    batch = {
        k: jax.ShapeDtypeStruct((B, T), jnp.float32 if k == "loss_mask" else jnp.int32)
        for k in ("inputs", "targets", "segment_ids", "positions", "loss_mask")
    }
    step = train_state.jit_step(
        make_train_step(graphdef, tx, schedule), mesh, state_sh, out_shardings=(state_sh, None)
    )
    coll = hlo.collectives(step.lower(state, batch).compile().as_text())
    assert any(c.op == "all-gather" for c in coll)  # the weights, per layer
    # (the embedding lookup's token ids, [B, T, 1] int32, may travel: 4 bytes a token)
    whole_batch = [
        c
        for c in coll
        for s in c.shapes
        if len(s) >= 3 and s[:2] == (B, T) and math.prod(s[2:]) > 1
    ]
    assert not whole_batch, whole_batch
