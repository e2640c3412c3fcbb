"""``train_and_evaluate(config, workdir)``: a whole pretraining run.

``train_and_evaluate`` reads as the run's outline; each step is one method of ``Run``:
specs (every check before any compile) -> mesh -> data -> model and optimizer (from shapes
straight into sharded arrays) -> resume or initialise -> compiled steps -> the loop (progress
line, held-out evaluation, checkpoints, SIGTERM/SIGINT, non-finite guard) -> final held-out
loss and evaluation suite -> loss plot and summary.json.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from hwh_jax import storage
from hwh_jax.data.pipeline import build_splits, eval_batches, train_dataset
from hwh_jax.eval import stats
from hwh_jax.eval.suite import EvalModel, check_for_run, run_suite
from hwh_jax.layers import remat
from hwh_jax.loggers import make_loggers
from hwh_jax.metrics import MetricsWriter, format_duration, plot_loss, progress_line
from hwh_jax.models.params import param_table
from hwh_jax.profiling import host_gc, profile
from hwh_jax.training import lease, memory, preflight
from hwh_jax.training import sharding as shd
from hwh_jax.training import workdir as workdir_lib
from hwh_jax.training.checkpoint import Checkpointer, abstract_with_shardings
from hwh_jax.training.compiled import RematCompilers
from hwh_jax.training.flops import flops_per_token, peak_flops
from hwh_jax.training.optimizer import make_optimizer
from hwh_jax.training.signals import StopOnSignal
from hwh_jax.training.specs import run_specs
from hwh_jax.training.state import (
    init_train_state,
    jit_step,
    threefry_kernel,
    train_state_shardings,
)
from hwh_jax.training.steps import make_eval_step

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
        run = Run(config, workdir, stop)
        try:
            run.make_mesh()
            run.load_data()
            run.build_model_and_optimizer()
            run.restore_or_initialise()
            run.compile_steps()
            run.train()
            run.evaluate_final()
        except BaseException:
            run.abandon()
            raise
        return run.finish()


def unigram_entropy(stream) -> float:
    """Entropy (nats/token) of the corpus' unigram distribution: the loss of a model that
    ignores context, which a language model must beat (a prepared stream's histogram is read,
    not recounted)."""
    counts = (
        stream.counts() if hasattr(stream, "counts") else np.bincount(np.asarray(stream, np.int64))
    )
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


class Diverged(FloatingPointError):
    """The loss exploded or the gradient vanished (``Run.check_sane``)."""


class Run:
    """The state of one pretraining run between the steps of ``train_and_evaluate``."""

    def __init__(self, config, workdir, stop=None):
        self.config, self.c = config, config.train
        self.stop = stop or StopOnSignal("saving a checkpoint and stopping")
        self.workdir = storage.absolute(workdir)  # a local folder or a bucket URL
        self.specs = run_specs(config)
        preflight.check_run(
            config,
            dict(zip(shd.MESH_AXES, shd.mesh_shape(config.train.mesh, jax.device_count()))),
            processes=jax.process_count(),
        )
        storage.make_folder(self.workdir)  # refused in one line where it cannot be
        with storage.writable(self.workdir):  # the lease: the first file written
            self.lease = self._take_lease()
        try:  # checked now, written once the data's checks pass
            workdir_lib.bind(self.workdir, config, write=False)
        except BaseException:
            self.release_lease()
            raise
        self.t0, self.wall_before = time.time(), 0.0
        self.losses, self.batch_ids, self.heldout = {}, {}, {}
        self.stopped_early = self.halted = self.signalled = False
        self.final = None
        self.evaluation = None

    # ------------------------------------------------------------ the workdir's lease
    def _take_lease(self):
        """Process 0 takes the workdir's lease (``lease``) for the job; every process learns
        whether it did, so that a refused job ends in all its processes."""
        seconds = self.c.get("lease_seconds", 120.0)
        held, error = None, None
        if jax.process_index() == 0 and seconds > 0:
            try:
                held = lease.acquire(self.workdir, stale_after=seconds)
            except lease.WorkdirBusy as e:
                error = e
        if jax.process_count() > 1 and seconds > 0:
            ok = int(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
            if not ok and error is None:
                error = lease.WorkdirBusy(
                    f"workdir {self.workdir} is in use by another run "
                    f"(process 0 found its lease; see its log)"
                )
        if error is not None:
            raise error
        return held

    def release_lease(self):
        if getattr(self, "lease", None) is not None:
            self.lease.release()
            self.lease = None

    # ------------------------------------------------------------ mesh
    def make_mesh(self):
        c = self.c
        self.mesh = shd.make_mesh(tuple(c.mesh))  # checked against the run in __init__

    # ------------------------------------------------------------ data
    def load_data(self):
        t = time.time()
        spec = self.specs.eval  # checked before training, not after it,
        self.splits = splits = build_splits(  # and before the corpus is tokenised
            self.specs.data,
            self.config.seq_len,
            check_tokenizer=None
            if spec is None
            else lambda tok: check_for_run(spec, tok, self.config.seq_len),
        )
        self.cfg = self.specs.model_for(splits.tokenizer.vocab_size)
        # bound once every check that needs the data passed: a refused start leaves no
        # config.json behind (its check against an existing one ran in __init__)
        workdir_lib.bind(self.workdir, self.config, write=jax.process_index() == 0)
        self.entropy = unigram_entropy(splits.train.stream)
        log.info(
            "data: train %r, held-out %r, tokenizer %s (%d), unigram entropy %.3f nats (%.1fs)",
            splits.train,
            splits.heldout,
            splits.tokenizer.name,
            splits.tokenizer.vocab_size,
            self.entropy,
            time.time() - t,
        )
        self.train_iter = iter(
            train_dataset(
                splits.train,
                global_batch=self.c.batch_size,
                seed=self.config.seed,
                process_index=jax.process_index(),
                process_count=jax.process_count(),
                workers=self.specs.data.workers,
            )
        )

    # ------------------------------------------------------------ model and optimizer
    def build_model_and_optimizer(self):
        cfg, c = self.cfg, self.c
        self.tx, self.schedule = make_optimizer(self.specs.optimizer)
        self.graphdef, self.abstract_state, self.state_sh = train_state_shardings(
            cfg, self.tx, self.mesh
        )
        self.params = param_table(cfg)
        self.flops = flops_per_token(cfg, self.config.seq_len)
        self.device_kind = jax.devices()[0].device_kind
        peak = c.peak_flops or peak_flops(self.device_kind)
        self.peak_total = peak * jax.device_count() if peak else None
        log.info(
            "model %s: %s params, FA %s / LA %s per layer; %.3g FLOPs/token; mesh %s on %d x %s",
            cfg.arch,
            f"{self.params['total']:,}",
            cfg.fa_heads,
            cfg.la_heads,
            self.flops,
            dict(self.mesh.shape),
            jax.device_count(),
            self.device_kind,
        )

    # ------------------------------------------------------------ resume or initialise
    def restore_or_initialise(self):
        self.ckpt = Checkpointer(
            self.workdir, keep=self.c.keep_checkpoints, asynchronous=self.c.async_checkpoints
        )
        restored = self.ckpt.restore(abstract_with_shardings(self.abstract_state, self.state_sh))
        first = jax.process_index() == 0
        loggers = (
            make_loggers(
                self.c.loggers,
                self.workdir,
                config=json.loads(self.config.to_json_best_effort()),
                name=f"{self.cfg.arch}@{self.workdir.name}",
                project=self.c.wandb_project,
            )
            if first
            else []
        )
        self.writer = MetricsWriter(self.workdir, enabled=first, loggers=loggers)
        if restored is None:
            self._refuse_over_lost_checkpoints()
            cfg, tx = self.cfg, self.tx
            with threefry_kernel():
                t = time.time()
                self.state = jax.block_until_ready(
                    jax.jit(
                        lambda seed: init_train_state(cfg, tx, seed), out_shardings=self.state_sh
                    )(jnp.int32(self.config.seed))
                )
            log.info("initialised the train state in %.1fs", time.time() - t)
            self.start = 0
        else:
            self.start, self.state, data_state, meta = restored
            self.train_iter.set_state(data_state)
            self.wall_before = float(meta.get("wall_s", 0.0))
            dropped = self.writer.truncate(self.start)
            log.info(
                "resumed from step %d in %s%s",
                self.start,
                self.ckpt.directory,
                f" ({dropped} metrics rows past it dropped)" if dropped else "",
            )
        if self.start == 0:
            self.writer.truncate(0)  # a fresh start keeps no older rows

    def _refuse_over_lost_checkpoints(self):
        """No checkpoint restored although some were written and every one was set aside as
        unreadable or corrupt (this start or an earlier one): starting over would replace the
        run's metrics and bury its checkpoints, so the start is refused with what was found
        and the way on. (Checkpoints the run itself marked suspect after a non-finite loss
        are skipped, and a start with none left begins again: that is their purpose.)"""
        folder = self.ckpt.directory
        aside = (
            sorted(
                p.name
                for p in folder.iterdir()
                if re.fullmatch(r"\d+\.(unreadable|corrupt)\.\d+", p.name)
            )
            if folder.exists()
            else []
        )
        if not aside or self.ckpt.steps():
            return
        raise ValueError(
            f"no checkpoint of {self.workdir} can be restored (set aside: "
            f"{', '.join(aside[:4])}{' ...' if len(aside) > 4 else ''}): starting over would "
            f"replace this run's metrics. Move {folder} away to start over here, or use a new "
            f"--workdir"
        )

    # ------------------------------------------------------------ steps
    def compile_steps(self):
        """The train step compiled at the micro-batch ``memory.plan`` chooses (or the one
        ``train.grad_accum`` sets), and the eval step."""
        c = self.c
        self.batch_sh = shd.batch_sharding(self.mesh)
        self.first_batch = next(self.train_iter)  # its shapes; the loop trains on it first
        batch = {
            k: jax.ShapeDtypeStruct(
                (c.batch_size, *np.shape(v)[1:]), np.asarray(v).dtype, sharding=self.batch_sh
            )
            for k, v in self.first_batch.items()
            if k != "index"
        }

        dp = shd.data_parallel_size(self.mesh)
        compile_for = RematCompilers(  # the step under each remat policy
            self.cfg,
            self.graphdef,
            self.tx,
            self.mesh,
            schedule=self.schedule,
            state_sh=self.state_sh,
            state=self.state,
            batch=batch,
            batch_size=c.batch_size,
            z_loss=c.z_loss,
            document_mask=c.document_mask,
            loss_impl=c.loss_impl,
        )
        # the config's remat policy, then those that keep less (layers/remat.py), until one
        # fits one sequence a device
        policies = remat.fallbacks(self.cfg.remat, jax.default_backend())
        limit = memory.device_limit(c.device_memory_gb)
        key = memory.plan_key(
            self.config.model.to_dict(),
            self.config.seq_len,
            c.batch_size,
            c.grad_accum,
            c.loss_impl,
            c.z_loss,
            c.document_mask,
            dict(self.mesh.shape),
            jax.device_count(),
            self.device_kind,
            jax.__version__,
            limit,
        )
        again = memory.remembered(self.workdir, key) if not c.grad_accum else None
        if again:
            policy = memory.remembered_remat(self.workdir, key) or policies[0]
            compiled = compile_for(policy)(again)
            n, last = memory.accumulation(c.batch_size, again)
            self.plan = memory.Plan(
                again,
                n,
                memory.step_bytes(compiled),
                limit,
                "remembered",
                last=last,
                remat=policy,
            )
            if limit is not None and self.plan.step_bytes > limit:
                again = None
        if not again:
            self.plan, compiled = memory.plan_remat(
                compile_for,
                policies,
                batch=c.batch_size,
                dp=dp,
                limit=limit,
                grad_accum=c.grad_accum,
                advice=self._fit_advice,
            )
        if jax.process_count() > 1:  # every process runs process 0's plan
            micro = int(multihost_utils.broadcast_one_to_all(np.int32(self.plan.micro_batch)))
            if micro != self.plan.micro_batch:
                compiled = compile_for(self.plan.remat)(micro)
                n, last = memory.accumulation(c.batch_size, micro)
                self.plan = dataclasses.replace(
                    self.plan,
                    micro_batch=micro,
                    grad_accum=n,
                    last=last,
                    step_bytes=memory.step_bytes(compiled),
                )
        if jax.process_index() == 0:
            memory.remember(self.workdir, key, self.plan)
        if jax.process_index() == 0:  # the console and stdout, like the progress lines
            print(f"memory plan: {self.plan.describe()}", flush=True)
        if self.plan.remat != policies[0]:  # a policy that keeps less made it fit
            self.cfg = self.cfg.replace(remat=self.plan.remat)
            self.graphdef = compile_for.graphdef(self.plan.remat)
        self.train_step = compiled
        self.eval_step = jit_step(
            make_eval_step(self.graphdef, document_mask=c.document_mask),
            self.mesh,
            self.state_sh["params"],
        )

    def _fit_advice(self) -> str:
        """What would make a config that does not fit fit (for ``memory.plan``'s error)."""
        state = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.abstract_state))
        mesh = dict(self.mesh.shape)
        return (
            f"The parameters and optimizer state alone are {memory.size(state)} "
            f"before sharding (mesh {mesh}). To fit: more devices; an fsdp or tensor mesh "
            f"(train.mesh=(1,{jax.device_count()},1) shards parameters, optimizer state and "
            f"gradients over the devices); a shorter context (seq_len={self.config.seq_len}); "
            f"a smaller model; or more memory per device (train.device_memory_gb, "
            f"XLA_PYTHON_CLIENT_MEM_FRACTION on GPU). Every remat policy down to "
            f"model.remat=full was tried"
        )

    def put(self, batch):
        """A host batch (this process's rows) as global arrays over the batch axes."""
        return {
            k: jax.make_array_from_process_local_data(self.batch_sh, np.asarray(v))
            for k, v in batch.items()
            if k != "index"
        }

    def heldout_loss(self, params) -> float | None:
        if self.splits.heldout is None:
            return None
        total, count = 0.0, 0.0
        for b in eval_batches(
            self.splits.heldout,
            batch=self.plan.micro_batch,
            max_batches=self.c.eval_batches or None,
        ):
            s, n = self.eval_step(params, self.put(b))
            total, count = total + float(s), count + float(n)
        return total / max(count, 1.0)

    # ------------------------------------------------------------ the loop
    def train(self):
        c = self.c
        loop = _Loop(self)
        tracer = _Tracer(c.profile_at, c.profile_steps, self.workdir / "profile")
        self.last_save, self.last_save_step = time.time(), self.start
        if c.profile_at and c.profile_at <= self.start:
            log.warning(
                "train.profile_at=%d is not after step %d, where this run resumes: "
                "nothing will be traced",
                c.profile_at,
                self.start,
            )
        stop_at = c.stop_at_step or c.steps
        stop, vote = self.stop, _StopVote()
        step = self.start
        halt = vote.before_first(stop.signal)
        minutes = c.checkpoint_minutes
        while step < stop_at and not halt:
            t_data = time.time()
            batch, self.first_batch = self.first_batch or next(self.train_iter), None
            waited = time.time() - t_data
            ids = batch["index"].tolist()
            self.state, m = self.train_step(self.state, self.put(batch))
            step += 1
            if step == self.start + 1:  # compiled: later collections skip what setup built
                log.info(
                    "froze %d objects out of the garbage collector's walks (host_gc)",
                    host_gc.freeze(),
                )
            loop.pending.append((step, m, ids, waited))
            if loop.due is not None:  # the last log point's line, with this step queued behind
                loop.flush(loop.due)
            tracing = tracer.step(step, self.state)
            if (step % c.log_every == 0 or step == stop_at) and not tracing:
                if step < stop_at:
                    loop.due = step  # read once the next step is dispatched: no device stall
                else:
                    loop.flush(step)
            if c.eval_every and step % c.eval_every == 0 and step < c.steps:
                loop.flush(step)
                self._record_heldout(step, self.heldout_loss(self.state["params"]), echo=True)
            if c.checkpoint_every and step % c.checkpoint_every == 0:
                loop.flush(step)
                self.save(step)
            timed = bool(minutes) and time.time() - self.last_save >= 60 * minutes
            halt, save_due = vote(stop.signal, timed)  # every process decides the same
            if save_due and not halt and step > self.last_save_step + 1:  # not a stale flag
                loop.flush(step)
                self.save(step)
            if halt:
                loop.flush(step)
                self.save(step)  # no-op when this step's checkpoint exists
                self.stopped_early = True
                print(
                    f"stopped by {stop.signal or 'a signal to another process'} at step "
                    f"{step}; checkpoint saved",
                    flush=True,
                )
                break
        loop.flush(step)
        if halt and step == self.start:
            self.stopped_early = True
            print(
                f"stopped by {stop.signal} before the first step; nothing new to save", flush=True
            )
        self.halted = halt
        self.signalled = halt
        if step == stop_at and step not in self.ckpt.steps():
            self.save(step)
        self.stopped_early = self.stopped_early or step < c.steps
        host_gc.unfreeze()  # what the run built can be collected again once it is dropped
        self.step = step

    def check_finite(self, bad: int | None = None):
        """Stop at a step whose loss or gradient was not finite (its update was skipped): the
        newest checkpoint is marked suspect, so the next start does not simply repeat it.
        ``bad``: the state's ``bad_step`` as a step's metrics carried it (default: read from the
        newest state, which waits for its step)."""
        bad = int(self.state["bad_step"]) if bad is None else bad
        if bad < 0:
            return
        self.ckpt.wait()  # the save in flight is the newest checkpoint
        steps = self.ckpt.steps()
        where = "no checkpoint was written"
        if steps and jax.process_index() == 0:
            marker = self.ckpt.mark_suspect(
                steps[-1],
                f"non-finite loss or gradient at step {bad + 1} of a run that continued from it",
            )
            earlier = [s for s in steps[:-1] if not self.ckpt.suspect(s).exists()]
            where = (
                f"the checkpoint of step {steps[-1]}, which led to it, is marked suspect "
                f"({marker.name}) and the next start skips it"
                + (
                    f" (then resumes from step {earlier[-1]})"
                    if earlier
                    else " (then starts from scratch)"
                )
                + "; change what caused it (train.lr, the data) or delete the marker"
            )
        raise FloatingPointError(
            f"non-finite loss or gradient at step {bad + 1} (its update was skipped); {where}"
        )

    def check_sane(self, step: int, loss: float, grad_norm: float):
        """Stop (``Diverged``, one line) at a step whose loss exploded or whose gradient
        vanished. A step's loss and gradient are those of the weights before its update, so
        the culprit is the checkpoint of the step before (if one was saved there): it is
        marked suspect, and the next start resumes from the newest checkpoint before it (the
        loop checks every step's metrics at its log points and before every save, so every
        earlier checkpoint held weights whose next step was sane; with
        ``train.keep_checkpoints`` >= 2 one of them is kept).

        Exploded: a loss more than 1 nat above ln V, the loss of a uniform guess over the
        vocabulary. A model starts near ln V (small initial logits) and only goes down; 1 nat
        above it means the right token gets e times less than uniform mass, which only logits
        blown up by a too-large step produce. Vanished: a gradient norm below 1e-6 (a dead
        network: every unit saturated; the optimizer cannot move it again, as after
        ``train.lr=1e6``). Non-finite values are ``check_finite``'s."""
        ceiling = math.log(self.cfg.vocab_size) + 1.0
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return
        if loss > ceiling:
            what = (
                f"the loss exploded at step {step}: {loss:.3f}, more than ln V + 1 = "
                f"{ceiling:.3f} (worse than a uniform guess over the {self.cfg.vocab_size} "
                f"tokens)"
            )
        elif grad_norm < 1e-6:
            what = (
                f"the gradient vanished at step {step} (norm {grad_norm:.1e}, loss "
                f"{loss:.3f}): the network is dead and cannot learn again"
            )
        else:
            return
        self.ckpt.wait()
        culprit = [s for s in self.ckpt.steps() if s >= step - 1]
        if culprit and jax.process_index() == 0:
            for s in culprit:
                self.ckpt.mark_suspect(s, what)
        steps = [
            s for s in self.ckpt.steps() if not self.ckpt.suspect(s).exists() and s not in culprit
        ]
        where = (
            f"the next start resumes from step {steps[-1]}, the newest checkpoint whose "
            f"next step was sane"
            if steps
            else "the next start begins again"
        )
        marked = (
            f"the checkpoint of step {culprit[0]} holds those weights and is marked suspect; "
            if culprit
            else ""
        )
        raise Diverged(
            f"{what}; {marked}{where}. Lower train.lr (now {self.c.lr:g}), raise "
            f"train.warmup_steps or set train.clip_norm, then start again"
        )

    def save(self, step: int):
        self.check_finite()
        meta = {
            "config": json.loads(self.config.to_json_best_effort()),
            "arch": self.cfg.arch,
            "step": step,
            "wall_s": self.wall_before + time.time() - self.t0,
        }
        self.ckpt.save(step, self.state, self.train_iter.get_state(), meta)
        self.last_save, self.last_save_step = time.time(), step
        self.writer.flush()
        storage.sync_all()  # a bucket workdir's staged files (logs, events) go up

    def _record_heldout(self, step: int, loss: float | None, echo: bool = False):
        self.heldout[step] = loss
        if loss is None:
            return
        ppl = math.exp(min(loss, 50))
        self.writer.write(step, "heldout", {"loss": loss, "perplexity": ppl})
        if echo and jax.process_index() == 0:
            print(f"step {step:>6d} | held-out loss {loss:.4f} | ppl {ppl:.2f}", flush=True)

    # ------------------------------------------------------------ final evaluation
    def evaluate_final(self):
        if self.step < self.c.steps or self.halted:
            return
        if self.c.final_eval:
            self.final = self.heldout_loss(self.state["params"])
            self._record_heldout(self.step, self.final)
        if self.specs.eval is not None and jax.process_count() > 1:
            print(
                f"the evaluation suite runs in one process: python -m launch.eval "
                f"--checkpoint={self.workdir}",
                flush=True,
            )
        elif self.specs.eval is not None:
            # the training's summary first: a run cut during its evaluation keeps it
            self.write_summary()
            spec = self.specs.eval
            subject = EvalModel(
                nnx.merge(self.graphdef, self.state["params"]),
                self.splits.tokenizer,
                int(self.config.seq_len),
                f"{self.cfg.arch}@{self.workdir.name}",
                arch=self.cfg.arch,
                step=self.step,
                workdir=str(self.workdir),
                heldout=None if self.splits.heldout is None else self.splits.heldout.stream,
                seed=int(self.config.seed),
            )
            print(
                f"evaluating the final model: {', '.join(spec.suites)} -> {self.workdir / 'eval'}",
                flush=True,
            )

            def log_or_stop(line):
                print(line, flush=True)
                if self.stop.signal:
                    raise _Stopped(self.stop.signal)

            try:
                self.evaluation = run_suite(subject, spec, self.workdir / "eval", log=log_or_stop)
            except Exception as e:
                # a signal sent to the process group also reaches the compilers the evaluation
                # runs (ptxas), which then fail its next compile: that is the stop, not a bug
                if not (isinstance(e, _Stopped) or self.stop.signal):
                    raise
                cut = "" if isinstance(e, _Stopped) else f" (cut off: {type(e).__name__})"
                print(
                    f"stopped by {self.stop.signal} during the evaluation{cut}; the checkpoint "
                    f"of step {self.step} is complete (python -m launch.eval "
                    f"--checkpoint={self.workdir} evaluates it)",
                    flush=True,
                )
                return
            if "niah_intervals" in self.evaluation:
                print(
                    "NIAH (mean score [95% interval of the share right] n): "
                    + ", ".join(
                        f"{k} {stats.fmt_share(v)}"
                        for k, v in self.evaluation["niah_intervals"].items()
                    ),
                    flush=True,
                )

    # ------------------------------------------------------------ outputs
    def summary(self) -> dict:
        tokens_per_step = self.c.batch_size * self.config.seq_len
        out = {
            "arch": self.cfg.arch,
            "params": self.params["total"],
            "steps": self.step,
            "tokens": self.step * tokens_per_step,
            "final_heldout_loss": self.final,
            "unigram_entropy": self.entropy,
            "last_train_loss": self.losses[max(self.losses)] if self.losses else None,
            "wall_s": self.wall_before + time.time() - self.t0,  # over every start of the run
            "devices": f"{jax.device_count()} x {self.device_kind}",
            "mesh": dict(self.mesh.shape),
            "flops_per_token": self.flops,
            "memory_plan": self.plan.to_json(),
        }
        if self.evaluation is not None:
            out["eval"] = {
                k: self.evaluation[k]
                for k in ("niah_summary", "niah_intervals", "wall_s")
                if k in self.evaluation
            }
        return out

    def write_summary(self):
        storage.write_text(self.workdir / "summary.json", json.dumps(self.summary(), indent=2))

    def abandon(self):
        """On a failure: let an asynchronous save finish (it holds a good step) and flush the
        metrics; their own errors are logged, the failure that brought us here is raised."""
        for what in ("ckpt", "writer"):
            if hasattr(self, what):
                try:
                    getattr(self, what).close()
                except Exception:  # the original failure matters more
                    log.warning("closing the %s after a failure failed", what, exc_info=True)
        self.release_lease()
        storage.sync_all()

    def finish(self) -> RunResult:
        summary = self.summary()
        if jax.process_index() == 0:
            self.write_summary()
            for logger in self.writer.loggers:
                logger.summary(
                    {k: v for k, v in summary.items() if isinstance(v, (int, float, str))}
                )
            if not self.stopped_early:
                tokens_per_step = self.c.batch_size * self.config.seq_len
                plot_loss(
                    self.workdir / "metrics.jsonl",
                    self.workdir / "loss.png",
                    title=f"{self.cfg.arch}: {self.step} steps x {tokens_per_step} tokens",
                    reference={"unigram entropy": self.entropy},
                )
            if self.final is not None:
                print(
                    f"done: {self.step} steps, held-out loss {self.final:.4f} (ppl "
                    f"{math.exp(self.final):.2f}) vs unigram entropy {self.entropy:.4f}; "
                    f"wall {format_duration(summary['wall_s'])}; outputs in {self.workdir}",
                    flush=True,
                )
        self.writer.close()
        self.ckpt.close()  # waits for an asynchronous save to be committed
        self.release_lease()
        storage.sync_all()
        return RunResult(
            self.step,
            self.losses,
            self.batch_ids,
            self.heldout,
            self.stopped_early,
            summary,
            signalled=self.signalled or bool(self.stop.signal),
        )


class _Loop:
    """The loop's bookkeeping: steps' metrics fetched at log points (no per-step sync), the
    progress line and its throughput window. A log point's line is written once the next step
    is dispatched (``due``), so the device runs that step while the host reads the metrics and
    writes, and the window runs from one log point's step ending to the next's (or from the
    step after it, when that one had ended too by the time the line was read)."""

    def __init__(self, run: Run):
        self.run = run
        self.pending = []  # (step, metrics on device, batch ids, seconds its batch took)
        self.t_last, self.step_last = time.time(), run.start
        self.due = None  # a log point's step whose line waits for the next dispatch
        self.tps, self.dt, self.steps = 0.0, 0.0, 0  # the last window's rate

    def flush(self, step: int):
        """The metrics of the steps up to ``step`` to the log, and the progress line at it."""
        run, c = self.run, self.run.c
        done = [p for p in self.pending if p[0] <= step]
        self.pending = [p for p in self.pending if p[0] > step]
        self.due = None
        done = [(s, jax.device_get(m), ids, w) for s, m, ids, w in done]
        for s, m, ids, _ in done:
            last = m
            run.losses[s] = float(m["loss"])
            run.batch_ids[s] = ids
            run.writer.write(s, "train", {k: m[k] for k in ("loss", "grad_norm", "lr")})
        if done:
            now, ended = time.time(), step
            # A dispatch may return only once its step is nearly done (the device's queue is
            # short), so by now the next step may have ended too: the window counts it then.
            if self.pending and self.pending[0][0] == step + 1 and _ready(self.pending[0][1]):
                ended = step + 1
            run.check_finite(int(last["bad_step"]))
            for s, m, _, _ in done:
                run.check_sane(s, float(m["loss"]), float(m["grad_norm"]))
            dt, steps = now - self.t_last, ended - self.step_last
            if steps < 1:  # this step was counted in the last window: its rate stands
                tps, dt, steps = self.tps, self.dt, self.steps
                now, ended = self.t_last, self.step_last
            else:
                tps = c.batch_size * run.config.seq_len * steps / max(dt, 1e-9)
            self.tps, self.dt, self.steps = tps, dt, steps
            mfu = run.flops * tps / run.peak_total if run.peak_total else None
            eta = ((c.stop_at_step or c.steps) - step) * dt / max(steps, 1)
            share = sum(p[3] for p in done) / max(dt, 1e-9)
            if jax.process_index() == 0:
                p = run.plan
                print(
                    progress_line(
                        step,
                        c.steps,
                        last,
                        tps,
                        mfu,
                        eta,
                        share,
                        f"{p.micro_batch}x{p.grad_accum} {memory.size(p.step_bytes)}",
                    ),
                    flush=True,
                )
            run.writer.write(
                step,
                "perf",
                {"tokens_per_s": tps, "data_wait_share": share, **({"mfu": mfu} if mfu else {})},
            )
            self.t_last, self.step_last = now, ended


def _ready(metrics) -> bool:
    """Whether a step's metrics (so the step) are computed, without waiting for them."""
    return all(x.is_ready() for x in jax.tree.leaves(metrics) if hasattr(x, "is_ready"))


class _StopVote:
    """Agreement across the processes of a run on when to stop and when a time-based save is
    due: a signal reaches one process (a preempted host) and each host's clock is its own, yet
    every process must save the same step and leave together. Each step, each process's two
    flags (signalled, save due) go into a max over all devices, dispatched behind the step and
    read after the next step's dispatch (no host stall); so all processes act after the step
    following the one where any raised a flag. One process: its own flags, at once.

    Why not ``multihost_utils.reached_preemption_sync_point``: it needs ``jax.distributed``'s
    preemption service, which catches SIGTERM itself (not SIGINT, nor a single process), and
    does not carry the time-based save; this vote works for one process or many, on any
    platform, and costs one all-reduce of two integers a step, off the critical path."""

    def __init__(self):
        self.several = jax.process_count() > 1
        self.pending = None
        if self.several:
            from jax.sharding import Mesh, NamedSharding, PartitionSpec

            mesh = Mesh(np.array(jax.devices()), ("p",))
            self.sharding = NamedSharding(mesh, PartitionSpec("p"))
            self.any = jax.jit(
                lambda f: jnp.max(f, axis=0), out_shardings=NamedSharding(mesh, PartitionSpec())
            )

    def before_first(self, signal_name) -> bool:
        return bool(signal_name) and not self.several

    def __call__(self, signal_name, save_due: bool = False) -> tuple[bool, bool]:
        """(stop now, save now), the same in every process."""
        if not self.several:
            return bool(signal_name), bool(save_due)
        flags = np.tile(
            np.array([[bool(signal_name), bool(save_due)]], np.int32), (jax.local_device_count(), 1)
        )
        new = self.any(jax.make_array_from_process_local_data(self.sharding, flags))
        previous, self.pending = self.pending, new
        if previous is None:
            return False, False
        stop, save = np.asarray(previous.addressable_data(0)).tolist()
        return bool(stop), bool(save)


class _Stopped(Exception):
    """Raised inside the closing evaluation when a stop signal arrived."""


class _Tracer:
    """Traces the steps after ``at`` (``count`` of them, dispatched as the loop dispatches them)
    into ``out_dir`` and prints where their device time went beside their wall time
    (``hwh_jax.profiling.profile``; the summary also goes to ``out_dir/summary.json``). No log
    line falls inside the traced steps, so its wait is not in them."""

    def __init__(self, at: int, count: int, out_dir):
        self.at, self.count, self.remote_dir = at, count, out_dir
        self.staged = self.out_dir = None  # the trace is written locally, then copied up
        self._ctx, self._t0 = None, 0.0

    def step(self, step: int, state) -> bool:
        """After dispatching ``step``: True while tracing."""
        if not self.at:
            return False
        if step == self.at:
            jax.block_until_ready(state)
            self.staged = storage.Staged(self.remote_dir)
            self.out_dir = self.staged.local
            self._ctx = profile.capture(self.out_dir)
            self._ctx.__enter__()
            self._t0 = time.perf_counter()
            return True
        if self._ctx is not None and step == self.at + self.count:
            jax.block_until_ready(state)
            wall_ms = 1e3 * (time.perf_counter() - self._t0) / self.count
            self._ctx.__exit__(None, None, None)
            self._ctx = None
            s = profile.summarize(self.out_dir, steps=self.count)
            (self.out_dir / "summary.json").write_text(json.dumps({"step_ms": wall_ms, **s}))
            self.staged.sync()
            print(
                f"profile of steps {self.at + 1}-{step} (wall {wall_ms:.1f} ms a step, "
                f"{self.remote_dir}):\n{profile.format_summary(s, wall_ms)}",
                flush=True,
            )
            return False
        return self._ctx is not None
