"""The train step compiled for a mesh at a micro-batch: one function, shared by the trainer and
``launch.plan``, so that the program a plan measures is the program a run executes.

``train_step_compiler(...)`` returns ``compile_at(micro_batch)``: the train step
(``steps.make_train_step``, accumulating ``ceil(batch / micro_batch)`` micro-batches) jitted
with the state's shardings (``state.jit_step``; the state donated), lowered for the abstract
state and batch given (their shardings place it: real devices, or a TPU topology's
compile-only devices) and compiled. ``memory.plan`` calls it at the micro-batches it probes.

One refusal of the TPU compiler is answered by compiling again with other options
(``compile_lowered``): "Ran out of memory in memory space sflag", the synchronisation flags of a
core (2 KiB on v5p), which the launcher's ``--xla_tpu_enable_async_collective_fusion_multiple_steps``
(collective fusions that span several steps, from MaxText's recipes: ``launch/devices.py``)
exhausts for HwH-1.4B's step at 32K on v5p, where the same step without it compiles. The
options a step needed are kept in ``options`` (a plan writes them; the log says so).
"""

from __future__ import annotations

import logging
import time

import jax

from hwh_jax.layers import remat
from hwh_jax.training import memory
from hwh_jax.training import sharding as shd
from hwh_jax.training.state import jit_step, train_state_shardings
from hwh_jax.training.steps import make_train_step

log = logging.getLogger(__name__)

SFLAG = "memory space sflag"  # the TPU compiler's error when a core's sync flags run out
WITHOUT_MULTI_STEP_FUSION = {"xla_tpu_enable_async_collective_fusion_multiple_steps": False}


def compile_lowered(lowered, options: dict | None = None):
    """``lowered.compile()``; where the TPU compiler runs out of sync-flag memory (``SFLAG``),
    again without multi-step collective fusion, the options used added to ``options``. Options
    an earlier compile of the same run needed (``options`` not empty) are used at once: the
    planner's later compiles (other micro-batches, remat policies) do not fail first."""
    if options:
        return lowered.compile(compiler_options=dict(options))
    try:
        return lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        if SFLAG not in str(e):
            raise
        first = str(e).splitlines()[0][:300]
    log.warning(
        "the TPU compiler refused the step (%s); compiling it again with %s",
        first,
        WITHOUT_MULTI_STEP_FUSION,
    )
    out = lowered.compile(compiler_options=WITHOUT_MULTI_STEP_FUSION)
    if options is not None:
        options.update(WITHOUT_MULTI_STEP_FUSION)
    return out


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
    options: dict | None = None,
):
    """``compile_at(micro_batch)`` for the global batch ``batch_size`` (module docstring).
    ``state`` and ``batch``: arrays or ShapeDtypeStructs carrying their shardings; ``options``:
    where the compiler options a compile needed are added (``compile_lowered``)."""
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
        lowered = jit_step(
            step_fn, mesh, state_sh, out_shardings=(state_sh, None), donate_argnums=(0,)
        ).lower(state, batch)
        out = compile_lowered(lowered, options)
        log.info("compiled the train step at micro-batch %d in %.1fs", micro, time.time() - t)
        return out

    return compile_at


class RematCompilers:
    """``train_step_compiler`` per remat policy, for ``memory.plan_remat``: the trainer's and
    ``launch.plan``'s one way to compile the step under a policy the config does not name
    (the same state; only the model's graph differs). ``graphdef(policy)`` is that graph,
    ``self(policy)`` its ``compile_at``; ``kw`` are ``train_step_compiler``'s arguments but the
    graph. ``options``: the compiler options any of its compiles needed (``compile_lowered``)."""

    def __init__(self, cfg, graphdef, tx, mesh, **kw):
        self.cfg, self.tx, self.mesh, self.kw = cfg, tx, mesh, kw
        self.options = {}
        self.graphdefs = {remat.ALIASES.get(cfg.remat, cfg.remat): graphdef}

    def graphdef(self, policy: str):
        if policy not in self.graphdefs:
            cfg = self.cfg.replace(remat=policy)
            self.graphdefs[policy] = train_state_shardings(cfg, self.tx, self.mesh)[0]
        return self.graphdefs[policy]

    def __call__(self, policy: str):
        return train_step_compiler(
            self.graphdef(policy), self.tx, mesh=self.mesh, options=self.options, **self.kw
        )
