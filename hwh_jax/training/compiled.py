"""The train step compiled for a mesh at a micro-batch: one function, shared by the trainer and
``launch.plan``, so that the program a plan measures is the program a run executes.

``train_step_compiler(...)`` returns ``compile_at(micro_batch)``: the train step
(``steps.make_train_step``, accumulating ``ceil(batch / micro_batch)`` micro-batches) jitted
with the state's shardings (``state.jit_step``; the state donated), lowered for the abstract
state and batch given (their shardings place it: real devices, or a TPU topology's
compile-only devices) and compiled. ``memory.plan`` calls it at the micro-batches it probes.
"""

from __future__ import annotations

import logging
import time

from hwh_jax.layers import remat
from hwh_jax.training import memory
from hwh_jax.training import sharding as shd
from hwh_jax.training.state import jit_step, train_state_shardings
from hwh_jax.training.steps import make_train_step

log = logging.getLogger(__name__)


def train_step_compiler(
    graphdef,
    tx,
    schedule,
    mesh,
    state_sh,
    state,
    batch,
    *,
    batch_size: int,
    z_loss: float,
    document_mask: bool,
    loss_impl: str,
):
    """``compile_at(micro_batch)`` for the global batch ``batch_size`` (module docstring).
    ``state`` and ``batch``: arrays or ShapeDtypeStructs carrying their shardings."""
    dp = shd.data_parallel_size(mesh)

    def compile_at(micro: int):
        n, _ = memory.accumulation(batch_size, micro)
        step_fn = make_train_step(
            graphdef,
            tx,
            schedule,
            grad_accum=n,
            micro_batch=micro,
            shards=dp,
            z_loss=z_loss,
            document_mask=document_mask,
            loss_impl=loss_impl,
        )
        log.info("compiling the train step at micro-batch %d ...", micro)
        t = time.time()
        out = (
            jit_step(step_fn, mesh, state_sh, out_shardings=(state_sh, None), donate_argnums=(0,))
            .lower(state, batch)
            .compile()
        )
        log.info("compiled the train step at micro-batch %d in %.1fs", micro, time.time() - t)
        return out

    return compile_at


class RematCompilers:
    """``train_step_compiler`` per remat policy, for ``memory.plan_remat``: the trainer's and
    ``launch.plan``'s one way to compile the step under a policy the config does not name
    (the same state; only the model's graph differs). ``graphdef(policy)`` is that graph,
    ``self(policy)`` its ``compile_at``; ``kw`` are ``train_step_compiler``'s arguments but the
    graph."""

    def __init__(self, cfg, graphdef, tx, mesh, **kw):
        self.cfg, self.tx, self.mesh, self.kw = cfg, tx, mesh, kw
        self.graphdefs = {remat.ALIASES.get(cfg.remat, cfg.remat): graphdef}

    def graphdef(self, policy: str):
        if policy not in self.graphdefs:
            cfg = self.cfg.replace(remat=policy)
            self.graphdefs[policy] = train_state_shardings(cfg, self.tx, self.mesh)[0]
        return self.graphdefs[policy]

    def __call__(self, policy: str):
        return train_step_compiler(self.graphdef(policy), self.tx, mesh=self.mesh, **self.kw)
