"""``train_and_evaluate(config, workdir)``: a whole pretraining run.

``train_and_evaluate`` reads as the run's outline. Each stage is a function whose result (a
small value) the later stages take, built in this order:

  ``open_run`` -> ``RunContext``: every check before any compile, the workdir and its lease
  ``shd.make_mesh`` -> the device mesh
  ``load_data`` -> ``Data``: the streams, the tokenizer, the model config its vocabulary decides
  ``build_model`` -> ``Model``: optimizer, shapes and shardings, parameter and FLOP counts
  ``restore_or_initialise`` -> ``Start``: checkpointer, metrics, the train state, its step
  ``compile_steps`` -> ``Steps``: the memory plan, the compiled train and eval steps
  ``Loop(...).run()`` -> ``Trained`` (training/loop.py): progress line, held-out evaluation,
      checkpoints, SIGTERM/SIGINT, non-finite guard
  ``evaluate_final`` -> ``Evaluated``: the final held-out loss and the evaluation suite
  ``finish`` -> ``RunResult``: loss plot, summary.json, everything closed.
The closing stages take the values before them as one ``Stages``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from hwh_jax import storage
from hwh_jax.data.pipeline import build_splits, train_dataset
from hwh_jax.eval import stats
from hwh_jax.eval.suite import EvalModel, check_for_run, run_suite
from hwh_jax.layers import remat
from hwh_jax.layers.config import ModelConfig
from hwh_jax.loggers import make_loggers
from hwh_jax.metrics import MetricsWriter, format_duration, plot_loss
from hwh_jax.models.params import param_table
from hwh_jax.training import lease, memory, preflight
from hwh_jax.training import sharding as shd
from hwh_jax.training import workdir as workdir_lib
from hwh_jax.training.checkpoint import Checkpointer, abstract_with_shardings
from hwh_jax.training.compiled import RematCompilers
from hwh_jax.training.flops import flops_per_token, peak_flops
from hwh_jax.training.loop import Diverged, Loop, Trained, heldout_loss, record_heldout
from hwh_jax.training.optimizer import make_optimizer
from hwh_jax.training.signals import StopOnSignal
from hwh_jax.training.specs import RunSpecs, run_specs
from hwh_jax.training.state import (
    init_train_state,
    jit_step,
    threefry_kernel,
    train_state_shardings,
)
from hwh_jax.training.steps import make_eval_step

__all__ = ["Diverged", "RunResult", "train_and_evaluate"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunResult:
    """What a run did: per-step train losses and batch indices (for resume checks), evals."""

    final_step: int
    losses: dict[int, float]
    batch_ids: dict[int, list[int]]
    heldout: dict[int, float]
    stopped_early: bool
    summary: dict
    signalled: bool = False  # stopped by SIGTERM/SIGINT (here or in another process)


def train_and_evaluate(config, workdir) -> RunResult:
    """Train ``config`` in ``workdir`` (resuming from its newest checkpoint), then evaluate.
    SIGTERM / SIGINT at any point end the run with a complete checkpoint of the last step
    trained (docs/training.md, "Faults")."""
    with StopOnSignal("saving a checkpoint and stopping") as stop:
        ctx = open_run(config, workdir, stop)
        try:
            mesh = shd.make_mesh(ctx.specs.train.mesh)  # checked in open_run
            data = load_data(ctx)
            model = build_model(ctx, data, mesh)
            start = restore_or_initialise(ctx, data, model)
            steps = compile_steps(ctx, data, model, mesh, start)
            trained = Loop(ctx, data, model, start, steps).run()
            run = Stages(ctx, data, model, mesh, start, steps, trained)
            run = dataclasses.replace(run, evaluated=evaluate_final(run))
        except BaseException:
            ctx.abandon()
            raise
        return finish(run)


def unigram_entropy(stream) -> float:
    """Entropy (nats/token) of the corpus' unigram distribution: the loss of a model that
    ignores context, which a language model must beat (a prepared stream's histogram is read,
    not recounted)."""
    counts = (
        stream.counts() if hasattr(stream, "counts") else np.bincount(np.asarray(stream, np.int64))
    )
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


# ---------------------------------------------------------------- the run's context
@dataclasses.dataclass
class RunContext:
    """What every stage reads: the config and its checked specs, the workdir (a local folder or
    a bucket URL) and its lease, the stop signal and this start's clock. ``closers``: what a
    failure closes (``abandon``), in order; the stages that open something add to it."""

    config: Any  # the run's ml_collections ConfigDict
    specs: RunSpecs
    workdir: Any
    stop: StopOnSignal
    lease: Any  # the workdir's lease (process 0), or None
    started: float  # time.time() at this start
    closers: list = dataclasses.field(default_factory=list)

    def release_lease(self):
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def abandon(self):
        """On a failure: let an asynchronous save finish (it holds a good step) and flush the
        metrics; their own errors are logged, the failure that brought us here is raised."""
        for what, close in self.closers:
            try:
                close()
            except Exception:  # the original failure matters more
                log.warning("closing the %s after a failure failed", what, exc_info=True)
        self.release_lease()
        storage.sync_all()


def open_run(config, workdir, stop=None) -> RunContext:
    """Every check that needs no data (specs, the mesh against the devices, the workdir against
    an earlier run's config), then the workdir's lease."""
    stop = stop or StopOnSignal("saving a checkpoint and stopping")
    workdir = storage.absolute(workdir)
    specs = run_specs(config)
    preflight.check_run(
        specs,
        dict(zip(shd.MESH_AXES, shd.mesh_shape(specs.train.mesh, jax.device_count()))),
        processes=jax.process_count(),
        platform=jax.default_backend(),
    )
    storage.make_folder(workdir)  # refused in one line where it cannot be
    with storage.writable(workdir):  # the lease: the first file written
        held = _take_lease(workdir, specs.train.lease_seconds)
    ctx = RunContext(config, specs, workdir, stop, held, time.time())
    try:  # checked now, written once the data's checks pass
        workdir_lib.bind(workdir, config, write=False)
    except BaseException:
        ctx.release_lease()
        raise
    return ctx


def _take_lease(workdir, seconds: float):
    """Process 0 takes the workdir's lease (``lease``) for the job; every process learns
    whether it did, so that a refused job ends in all its processes."""
    held, error = None, None
    if jax.process_index() == 0 and seconds > 0:
        try:
            held = lease.acquire(workdir, stale_after=seconds)
        except lease.WorkdirBusy as e:
            error = e
    if jax.process_count() > 1 and seconds > 0:
        ok = int(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
        if not ok and error is None:
            error = lease.WorkdirBusy(
                f"workdir {workdir} is in use by another run "
                f"(process 0 found its lease; see its log)"
            )
    if error is not None:
        raise error
    return held


# ---------------------------------------------------------------- data
@dataclasses.dataclass(frozen=True)
class Data:
    """The run's data: train and held-out streams with their tokenizer (``splits``), the
    training batches, and the model config whose vocabulary the tokenizer decides."""

    splits: Any  # build_splits: .train, .heldout (or None), .tokenizer
    train_iter: Any  # the training batches (its state goes into every checkpoint)
    model_cfg: ModelConfig
    entropy: float  # unigram entropy of the training stream, nats a token


def load_data(ctx: RunContext) -> Data:
    c, t = ctx.specs.train, time.time()
    spec = ctx.specs.eval  # checked before training, not after it,
    splits = build_splits(  # and before the corpus is tokenised
        ctx.specs.data,
        c.seq_len,
        check_tokenizer=None if spec is None else lambda tok: check_for_run(spec, tok, c.seq_len),
    )
    model_cfg = ctx.specs.model_for(splits.tokenizer.vocab_size)
    # bound once every check that needs the data passed: a refused start leaves no
    # config.json behind (its check against an existing one ran in open_run)
    workdir_lib.bind(ctx.workdir, ctx.config, write=jax.process_index() == 0)
    entropy = unigram_entropy(splits.train.stream)
    log.info(
        "data: train %r, held-out %r, tokenizer %s (%d), unigram entropy %.3f nats (%.1fs)",
        splits.train,
        splits.heldout,
        splits.tokenizer.name,
        splits.tokenizer.vocab_size,
        entropy,
        time.time() - t,
    )
    train_iter = iter(
        train_dataset(
            splits.train,
            global_batch=c.batch_size,
            seed=c.seed,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
            workers=ctx.specs.data.workers,
        )
    )
    return Data(splits, train_iter, model_cfg, entropy)


# ---------------------------------------------------------------- model and optimizer
@dataclasses.dataclass(frozen=True)
class Model:
    """The model and its optimizer as shapes and shardings (nothing allocated yet), and what
    the progress line and summary report of them."""

    optimizer: Any  # optax GradientTransformation
    schedule: Callable  # step -> learning rate
    graphdef: Any  # nnx.GraphDef of the model
    abstract_state: Any  # the train state's shapes
    state_shardings: Any  # and their NamedShardings over the mesh
    param_counts: dict  # models.params.param_table: "total" and by role
    flops_per_token: float
    device_kind: str
    peak_flops: float | None  # dense bf16 peak of all devices together, FLOP/s


def build_model(ctx: RunContext, data: Data, mesh) -> Model:
    cfg, c = data.model_cfg, ctx.specs.train
    optimizer, schedule = make_optimizer(ctx.specs.optimizer)
    graphdef, abstract_state, state_shardings = train_state_shardings(cfg, optimizer, mesh)
    counts = param_table(cfg)
    flops = flops_per_token(cfg, c.seq_len)
    device_kind = jax.devices()[0].device_kind
    peak = c.peak_flops or peak_flops(device_kind)
    log.info(
        "model %s: %s params, FA %s / LA %s per layer; %.3g FLOPs/token; mesh %s on %d x %s",
        cfg.arch,
        f"{counts['total']:,}",
        cfg.fa_heads,
        cfg.la_heads,
        flops,
        dict(mesh.shape),
        jax.device_count(),
        device_kind,
    )
    return Model(
        optimizer,
        schedule,
        graphdef,
        abstract_state,
        state_shardings,
        counts,
        flops,
        device_kind,
        peak * jax.device_count() if peak else None,
    )


# ---------------------------------------------------------------- resume or initialise
@dataclasses.dataclass(frozen=True)
class Start:
    """Where this start begins: the checkpointer and metrics writer of the workdir, the train
    state (restored or initialised) and its step, and the seconds earlier starts trained."""

    checkpointer: Checkpointer
    metrics: MetricsWriter
    state: dict
    step: int  # 0 for a fresh run
    wall_before: float


def restore_or_initialise(ctx: RunContext, data: Data, model: Model) -> Start:
    config, c = ctx.config, ctx.specs.train
    ckpt = Checkpointer(ctx.workdir, keep=c.keep_checkpoints, asynchronous=c.async_checkpoints)
    ctx.closers.append(("ckpt", ckpt.close))
    restored = ckpt.restore(abstract_with_shardings(model.abstract_state, model.state_shardings))
    first = jax.process_index() == 0
    loggers = (
        make_loggers(
            c.loggers,
            ctx.workdir,
            config=json.loads(config.to_json_best_effort()),
            name=f"{data.model_cfg.arch}@{ctx.workdir.name}",
            project=c.wandb_project,
        )
        if first
        else []
    )
    metrics = MetricsWriter(ctx.workdir, enabled=first, loggers=loggers)
    ctx.closers.append(("writer", metrics.close))
    wall_before = 0.0
    if restored is None:
        _refuse_over_lost_checkpoints(ctx.workdir, ckpt)
        cfg, tx = data.model_cfg, model.optimizer
        with threefry_kernel():
            t = time.time()
            state = jax.block_until_ready(
                jax.jit(
                    lambda seed: init_train_state(cfg, tx, seed),
                    out_shardings=model.state_shardings,
                )(jnp.int32(c.seed))
            )
        log.info("initialised the train state in %.1fs", time.time() - t)
        step = 0
    else:
        step, state, data_state, meta = restored
        data.train_iter.set_state(data_state)
        wall_before = float(meta.get("wall_s", 0.0))
        dropped = metrics.truncate(step)
        log.info(
            "resumed from step %d in %s%s",
            step,
            ckpt.directory,
            f" ({dropped} metrics rows past it dropped)" if dropped else "",
        )
    if step == 0:
        metrics.truncate(0)  # a fresh start keeps no older rows
    return Start(ckpt, metrics, state, step, wall_before)


def _refuse_over_lost_checkpoints(workdir, ckpt):
    """No checkpoint restored although some were written and every one was set aside as
    unreadable or corrupt (this start or an earlier one): starting over would replace the
    run's metrics and bury its checkpoints, so the start is refused with what was found
    and the way on. (Checkpoints the run itself marked suspect after a non-finite loss
    are skipped, and a start with none left begins again: that is their purpose.)"""
    folder = ckpt.directory
    aside = (
        sorted(
            p.name
            for p in folder.iterdir()
            if re.fullmatch(r"\d+\.(unreadable|corrupt)\.\d+", p.name)
        )
        if folder.exists()
        else []
    )
    if not aside or ckpt.steps():
        return
    raise ValueError(
        f"no checkpoint of {workdir} can be restored (set aside: "
        f"{', '.join(aside[:4])}{' ...' if len(aside) > 4 else ''}): starting over would "
        f"replace this run's metrics. Move {folder} away to start over here, or use a new "
        f"--workdir"
    )


# ---------------------------------------------------------------- compiled steps
@dataclasses.dataclass(frozen=True)
class Steps:
    """The compiled steps and what they were compiled for: the memory plan (micro-batch,
    accumulation, remat policy), the model as compiled (its remat may be a policy that keeps
    less than the config's, when that one did not fit), and the batch's sharding."""

    plan: memory.Plan
    train_step: Callable  # (state, batch) -> (state, metrics)
    eval_step: Callable  # (params, batch) -> (loss sum, tokens)
    batch_sharding: Any
    first_batch: dict  # drawn for the batch's shapes; the loop trains on it first
    model_cfg: ModelConfig
    graphdef: Any


def compile_steps(ctx: RunContext, data: Data, model: Model, mesh, start: Start) -> Steps:
    """The train step compiled at the micro-batch ``memory.plan`` chooses (or the one
    ``train.grad_accum`` sets), and the eval step."""
    config, c = ctx.config, ctx.specs.train
    batch_sharding = shd.batch_sharding(mesh)
    first_batch = next(data.train_iter)  # its shapes; the loop trains on it first
    batch = {
        k: jax.ShapeDtypeStruct(
            (c.batch_size, *np.shape(v)[1:]), np.asarray(v).dtype, sharding=batch_sharding
        )
        for k, v in first_batch.items()
        if k != "index"
    }
    model_cfg, graphdef = data.model_cfg, model.graphdef
    compile_for = RematCompilers(  # the step under each remat policy
        model_cfg,
        graphdef,
        model.optimizer,
        mesh,
        schedule=model.schedule,
        state_sh=model.state_shardings,
        state=start.state,
        batch=batch,
        batch_size=c.batch_size,
        z_loss=c.z_loss,
        document_mask=c.document_mask,
        loss_impl=c.loss_impl,
    )
    # the config's remat policy, then those that keep less (layers/remat.py), until one
    # fits one sequence a device
    policies = remat.fallbacks(model_cfg.remat, jax.default_backend())
    limit = memory.device_limit(c.device_memory_gb)
    key = memory.plan_key(
        config.model.to_dict(),
        c.seq_len,
        c.batch_size,
        c.grad_accum,
        c.loss_impl,
        c.z_loss,
        c.document_mask,
        dict(mesh.shape),
        jax.device_count(),
        model.device_kind,
        jax.__version__,
        limit,
    )
    plan = None
    again = memory.remembered(ctx.workdir, key) if not c.grad_accum else None
    if again:
        policy = memory.remembered_remat(ctx.workdir, key) or policies[0]
        compiled = compile_for(policy)(again)
        n, last = memory.accumulation(c.batch_size, again)
        plan = memory.Plan(
            again, n, memory.step_bytes(compiled), limit, "remembered", last=last, remat=policy
        )
        if limit is not None and plan.step_bytes > limit:
            again = None
    if not again:
        plan, compiled = memory.plan_remat(
            compile_for,
            policies,
            batch=c.batch_size,
            dp=shd.data_parallel_size(mesh),
            limit=limit,
            grad_accum=c.grad_accum,
            advice=lambda: _fit_advice(c.seq_len, model, mesh),
        )
    if jax.process_count() > 1:  # every process runs process 0's plan
        micro = int(multihost_utils.broadcast_one_to_all(np.int32(plan.micro_batch)))
        if micro != plan.micro_batch:
            compiled = compile_for(plan.remat)(micro)
            n, last = memory.accumulation(c.batch_size, micro)
            plan = dataclasses.replace(
                plan,
                micro_batch=micro,
                grad_accum=n,
                last=last,
                step_bytes=memory.step_bytes(compiled),
            )
    if jax.process_index() == 0:
        memory.remember(ctx.workdir, key, plan)
        print(f"memory plan: {plan.describe()}", flush=True)  # the console, like progress
    if plan.remat != policies[0]:  # a policy that keeps less made it fit
        model_cfg = model_cfg.replace(remat=plan.remat)
        graphdef = compile_for.graphdef(plan.remat)
    eval_step = jit_step(
        make_eval_step(graphdef, document_mask=c.document_mask),
        mesh,
        model.state_shardings["params"],
    )
    return Steps(plan, compiled, eval_step, batch_sharding, first_batch, model_cfg, graphdef)


def _fit_advice(seq_len: int, model: Model, mesh) -> str:
    """What would make a config that does not fit fit (for ``memory.plan``'s error)."""
    state = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model.abstract_state))
    return (
        f"The parameters and optimizer state alone are {memory.size(state)} "
        f"before sharding (mesh {dict(mesh.shape)}). To fit: more devices; an fsdp or tensor "
        f"mesh (train.mesh=(1,{jax.device_count()},1) shards parameters, optimizer state and "
        f"gradients over the devices); a shorter context (seq_len={seq_len}); "
        f"a smaller model; or more memory per device (train.device_memory_gb, "
        f"XLA_PYTHON_CLIENT_MEM_FRACTION on GPU). Every remat policy down to "
        f"model.remat=full was tried"
    )


# ---------------------------------------------------------------- final evaluation
@dataclasses.dataclass(frozen=True)
class Evaluated:
    """The closing evaluation: the final held-out loss and the suite's results (each None
    where it did not run)."""

    heldout_loss: float | None = None
    suite: dict | None = None


@dataclasses.dataclass(frozen=True)
class Stages:
    """The stages' values in the order they were made: what the closing stages read."""

    ctx: RunContext
    data: Data
    model: Model
    mesh: Any
    start: Start
    steps: Steps
    trained: Trained
    evaluated: Evaluated = Evaluated()


def evaluate_final(run: Stages) -> Evaluated:
    """The final held-out loss (``train.final_eval``) and the evaluation suite (``eval``),
    after a run that reached ``train.steps`` without a stop signal."""
    ctx, data, start, steps, trained = run.ctx, run.data, run.start, run.steps, run.trained
    c = ctx.specs.train
    if trained.step < c.steps or trained.halted:
        return Evaluated()
    final = None
    if c.final_eval:
        params = trained.state["params"]
        final = heldout_loss(data.splits.heldout, steps, params, c.eval_sequences)
        record_heldout(start.metrics, trained.heldout, trained.step, final)
    spec = ctx.specs.eval
    if spec is None:
        return Evaluated(final)
    if jax.process_count() > 1:
        print(
            f"the evaluation suite runs in one process: python -m launch.eval "
            f"--checkpoint={ctx.workdir}",
            flush=True,
        )
        return Evaluated(final)
    # the training's summary first: a run cut during its evaluation keeps it
    storage.write_text(
        ctx.workdir / "summary.json",
        json.dumps(summarize(dataclasses.replace(run, evaluated=Evaluated(final))), indent=2),
    )
    subject = EvalModel(
        nnx.merge(steps.graphdef, trained.state["params"]),
        data.splits.tokenizer,
        c.seq_len,
        f"{steps.model_cfg.arch}@{ctx.workdir.name}",
        arch=steps.model_cfg.arch,
        step=trained.step,
        workdir=str(ctx.workdir),
        heldout=None if data.splits.heldout is None else data.splits.heldout.stream,
        seed=c.seed,
        retrieval_format=ctx.specs.data.retrieval_format,
    )
    print(
        f"evaluating the final model: {', '.join(spec.suites)} -> {ctx.workdir / 'eval'}",
        flush=True,
    )

    def log_or_stop(line):
        print(line, flush=True)
        if ctx.stop.signal:
            raise _Stopped(ctx.stop.signal)

    try:
        evaluation = run_suite(subject, spec, ctx.workdir / "eval", log=log_or_stop)
    except Exception as e:
        # a signal sent to the process group also reaches the compilers the evaluation
        # runs (ptxas), which then fail its next compile: that is the stop, not a bug
        if not (isinstance(e, _Stopped) or ctx.stop.signal):
            raise
        cut = "" if isinstance(e, _Stopped) else f" (cut off: {type(e).__name__})"
        print(
            f"stopped by {ctx.stop.signal} during the evaluation{cut}; the checkpoint "
            f"of step {trained.step} is complete (python -m launch.eval "
            f"--checkpoint={ctx.workdir} evaluates it)",
            flush=True,
        )
        return Evaluated(final)
    if "niah_intervals" in evaluation:
        print(
            "NIAH (mean score [95% interval of the share right] n): "
            + ", ".join(
                f"{k} {stats.fmt_share(v)}" for k, v in evaluation["niah_intervals"].items()
            ),
            flush=True,
        )
    return Evaluated(final, evaluation)


class _Stopped(Exception):
    """Raised inside the closing evaluation when a stop signal arrived."""


# ---------------------------------------------------------------- outputs
def summarize(run: Stages) -> dict:
    """summary.json's content: what was trained, on what, how long, and how it scored."""
    ctx, data, model, mesh, start = run.ctx, run.data, run.model, run.mesh, run.start
    steps, trained, evaluated = run.steps, run.trained, run.evaluated
    tokens_per_step = ctx.specs.train.tokens_per_step
    out = {
        "arch": steps.model_cfg.arch,
        "params": model.param_counts["total"],
        "steps": trained.step,
        "tokens": trained.step * tokens_per_step,
        "final_heldout_loss": evaluated.heldout_loss,
        "unigram_entropy": data.entropy,
        "last_train_loss": trained.losses[max(trained.losses)] if trained.losses else None,
        "wall_s": start.wall_before + time.time() - ctx.started,  # over every start of the run
        "devices": f"{jax.device_count()} x {model.device_kind}",
        "mesh": dict(mesh.shape),
        "flops_per_token": model.flops_per_token,
        "memory_plan": steps.plan.to_json(),
    }
    if evaluated.suite is not None:
        out["eval"] = {
            k: evaluated.suite[k]
            for k in ("niah_summary", "niah_intervals", "wall_s")
            if k in evaluated.suite
        }
    return out


def finish(run: Stages) -> RunResult:
    """summary.json, the loggers' summaries, the loss plot and the closing line; everything
    closed (an asynchronous save committed) and the lease released."""
    ctx, data, start, steps, trained = run.ctx, run.data, run.start, run.steps, run.trained
    summary = summarize(run)
    if jax.process_index() == 0:
        storage.write_text(ctx.workdir / "summary.json", json.dumps(summary, indent=2))
        for logger in start.metrics.loggers:
            logger.summary({k: v for k, v in summary.items() if isinstance(v, (int, float, str))})
        if not trained.stopped_early:
            tokens_per_step = ctx.specs.train.tokens_per_step
            plot_loss(
                ctx.workdir / "metrics.jsonl",
                ctx.workdir / "loss.png",
                title=f"{steps.model_cfg.arch}: {trained.step} steps x {tokens_per_step} tokens",
                reference={"unigram entropy": data.entropy},
            )
        final = run.evaluated.heldout_loss
        if final is not None:
            print(
                f"done: {trained.step} steps, held-out loss {final:.4f} (ppl "
                f"{math.exp(final):.2f}) vs unigram entropy {data.entropy:.4f}; "
                f"wall {format_duration(summary['wall_s'])}; outputs in {ctx.workdir}",
                flush=True,
            )
    start.metrics.close()
    start.checkpointer.close()  # waits for an asynchronous save to be committed
    ctx.release_lease()
    storage.sync_all()
    return RunResult(
        trained.step,
        trained.losses,
        trained.batch_ids,
        trained.heldout,
        trained.stopped_early,
        summary,
        signalled=trained.halted or bool(ctx.stop.signal),
    )
