"""The training loop: ``Loop(...).run() -> Trained``.

The loop owns what changes while a run trains: the train state, the step, the losses read so
far and the time of the last save. It dispatches steps without waiting for them, reads their
metrics at log points (``_Window``: the progress line and its throughput), evaluates the
held-out loss every ``train.eval_every`` steps, saves checkpoints (every
``train.checkpoint_every`` steps, every ``train.checkpoint_minutes`` and on a stop signal, the
processes agreeing through ``_StopVote``), stops at a non-finite or diverged step with the
checkpoint that led to it marked suspect, and traces ``train.profile_at`` (``_Tracer``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from hwh_jax import storage
from hwh_jax.data.pipeline import eval_batches
from hwh_jax.metrics import progress_line
from hwh_jax.profiling import host_gc, profile
from hwh_jax.training import memory

log = logging.getLogger(__name__)


class Diverged(FloatingPointError):
    """The loss exploded or the gradient vanished (``Loop.check_sane``)."""


@dataclasses.dataclass(frozen=True)
class Trained:
    """What the loop leaves: the state after its last step and what it read on the way."""

    state: dict  # the train state after ``step``
    step: int  # the last step trained
    losses: dict[int, float]  # train loss of every step this start trained
    batch_ids: dict[int, list[int]]  # the batch indices of those steps (for resume checks)
    heldout: dict[int, float | None]  # held-out loss at the eval_every points
    stopped_early: bool  # before train.steps (a signal, or train.stop_at_step)
    halted: bool  # by a stop signal (here or in another process)


def put(batch_sharding, batch) -> dict:
    """A host batch (this process's rows) as global arrays over the batch axes."""
    return {
        k: jax.make_array_from_process_local_data(batch_sharding, np.asarray(v))
        for k, v in batch.items()
        if k != "index"
    }


def heldout_loss(heldout, steps, params, sequences: int) -> float | None:
    """Mean held-out loss per token of ``params`` over ``sequences`` rows of the held-out
    stream (``pipeline.eval_order``: the same rows for every run; 0: all; None without a
    held-out stream), in batches of the memory plan's micro-batch (``steps``: the compiled
    ``Steps``), which change the order of the sums only."""
    if heldout is None:
        return None
    total, count = 0.0, 0.0
    for b in eval_batches(heldout, batch=steps.plan.micro_batch, sequences=sequences):
        s, n = steps.eval_step(params, put(steps.batch_sharding, b))
        total, count = total + float(s), count + float(n)
    return total / max(count, 1.0)


class Loop:
    """One start's training from ``start.step`` to ``train.steps`` (or ``train.stop_at_step``)."""

    def __init__(self, ctx, data, model, start, steps):
        self.ctx, self.data, self.model, self.start, self.steps = ctx, data, model, start, steps
        self.train_config = ctx.specs.train
        self.checkpointer, self.metrics = start.checkpointer, start.metrics
        self.state, self.step = start.state, start.step
        self.losses, self.batch_ids, self.heldout = {}, {}, {}
        self.last_save, self.last_save_step = time.time(), start.step
        self.window = _Window(start.step)  # the progress line's window, from this start

    def run(self) -> Trained:
        c, start = self.train_config, self.start.step
        window = self.window
        tracer = _Tracer(c.profile_at, c.profile_steps, self.ctx.workdir / "profile")
        if c.profile_at and c.profile_at <= start:
            log.warning(
                "train.profile_at=%d is not after step %d, where this run resumes: "
                "nothing will be traced",
                c.profile_at,
                start,
            )
        stop_at = c.stop_at_step or c.steps
        stop, vote = self.ctx.stop, _StopVote()
        pending_batch = self.steps.first_batch
        train_iter, train_step = self.data.train_iter, self.steps.train_step
        step, stopped_early = start, False
        halt = vote.before_first(stop.signal)
        minutes = c.checkpoint_minutes
        while step < stop_at and not halt:
            t_data = time.time()
            batch, pending_batch = pending_batch or next(train_iter), None
            window.waited += time.time() - t_data
            ids = batch["index"].tolist()
            self.state, m = train_step(self.state, put(self.steps.batch_sharding, batch))
            step += 1
            self.step = step
            if step == start + 1:  # compiled: later collections skip what setup built
                log.info(
                    "froze %d objects out of the garbage collector's walks (host_gc)",
                    host_gc.freeze(),
                )
            window.pending.append((step, m, ids))
            if window.due is not None:  # the last log point's line, with this step queued behind
                self.flush(window.due)
            tracing = tracer.step(step, self.state)
            if (step % c.log_every == 0 or step == stop_at) and not tracing:
                if step < stop_at:
                    window.due = step  # read once the next step is dispatched: no device stall
                else:
                    self.flush(step)
            if c.eval_every and step % c.eval_every == 0 and step < c.steps:
                self.flush(step)
                self.record_heldout(step, self.heldout_loss(), echo=True)
            if c.checkpoint_every and step % c.checkpoint_every == 0:
                self.flush(step)
                self.save(step)
            timed = bool(minutes) and time.time() - self.last_save >= 60 * minutes
            halt, save_due = vote(stop.signal, timed)  # every process decides the same
            if save_due and not halt and step > self.last_save_step + 1:  # not a stale flag
                self.flush(step)
                self.save(step)
            if halt:
                self.flush(step)
                self.save(step)  # no-op when this step's checkpoint exists
                stopped_early = True
                print(
                    f"stopped by {stop.signal or 'a signal to another process'} at step "
                    f"{step}; checkpoint saved",
                    flush=True,
                )
                break
        self.flush(step)
        if halt and step == start:
            stopped_early = True
            print(
                f"stopped by {stop.signal} before the first step; nothing new to save", flush=True
            )
        if step == stop_at and step not in self.checkpointer.steps():
            self.save(step)
        host_gc.unfreeze()  # what the run built can be collected again once it is dropped
        return Trained(
            state=self.state,
            step=step,
            losses=self.losses,
            batch_ids=self.batch_ids,
            heldout=self.heldout,
            stopped_early=stopped_early or step < c.steps,
            halted=halt,
        )

    def flush(self, step: int):
        """The metrics of the steps up to ``step`` read, recorded and checked, and the progress
        line at it (``_Window``)."""
        window, c, model, plan = self.window, self.train_config, self.model, self.steps.plan
        done = window.take(step)
        for s, m, ids in done:
            self.losses[s] = float(m["loss"])
            self.batch_ids[s] = ids
            self.metrics.write(s, "train", {k: m[k] for k in ("loss", "grad_norm", "lr")})
        if not done:
            return
        last = done[-1][1]
        now, ended = window.ended(step)
        self.check_finite(int(last["bad_step"]))
        for s, m, _ in done:
            self.check_sane(s, float(m["loss"]), float(m["grad_norm"]))
        rate = window.close(now, ended, c.tokens_per_step)
        tps, share = rate.tokens_per_s, rate.data_share
        peak = model.peak_flops
        mfu = model.flops_per_token * tps / peak if peak else None
        eta = (c.last_step - step) * rate.seconds / max(rate.steps, 1)
        if jax.process_index() == 0:
            print(
                progress_line(
                    step,
                    c.steps,
                    last,
                    tps,
                    mfu,
                    eta,
                    share,
                    f"{plan.micro_batch}x{plan.grad_accum} {memory.size(plan.step_bytes)}",
                ),
                flush=True,
            )
        self.metrics.write(
            step,
            "perf",
            {"tokens_per_s": tps, "data_wait_share": share, **({"mfu": mfu} if mfu else {})},
        )

    def heldout_loss(self) -> float | None:
        return heldout_loss(
            self.data.splits.heldout,
            self.steps,
            self.state["params"],
            self.train_config.eval_sequences,
        )

    def record_heldout(self, step: int, loss: float | None, echo: bool = False):
        record_heldout(self.metrics, self.heldout, step, loss, echo)

    # ------------------------------------------------------------ checkpoints
    def save(self, step: int):
        self.check_finite()
        meta = {
            "config": json.loads(self.ctx.config.to_json_best_effort()),
            "arch": self.steps.model_cfg.arch,
            "step": step,
            "wall_s": self.start.wall_before + time.time() - self.ctx.started,
        }
        self.checkpointer.save(step, self.state, self.data.train_iter.get_state(), meta)
        self.last_save, self.last_save_step = time.time(), step
        self.metrics.flush()
        storage.sync_all()  # a bucket workdir's staged files (logs, events) go up

    # ------------------------------------------------------------ health
    def check_finite(self, bad: int | None = None):
        """Stop at a step whose loss or gradient was not finite (its update was skipped): the
        newest checkpoint is marked suspect, so the next start does not simply repeat it.
        ``bad``: the state's ``bad_step`` as a step's metrics carried it (default: read from the
        newest state, which waits for its step)."""
        bad = int(self.state["bad_step"]) if bad is None else bad
        if bad < 0:
            return
        ckpt = self.checkpointer
        ckpt.wait()  # the save in flight is the newest checkpoint
        steps = ckpt.steps()
        where = "no checkpoint was written"
        if steps and jax.process_index() == 0:
            marker = ckpt.mark_suspect(
                steps[-1],
                f"non-finite loss or gradient at step {bad + 1} of a run that continued from it",
            )
            earlier = [s for s in steps[:-1] if not ckpt.suspect(s).exists()]
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
        vocab = self.steps.model_cfg.vocab_size
        ceiling = math.log(vocab) + 1.0
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return
        if loss > ceiling:
            what = (
                f"the loss exploded at step {step}: {loss:.3f}, more than ln V + 1 = "
                f"{ceiling:.3f} (worse than a uniform guess over the {vocab} tokens)"
            )
        elif grad_norm < 1e-6:
            what = (
                f"the gradient vanished at step {step} (norm {grad_norm:.1e}, loss "
                f"{loss:.3f}): the network is dead and cannot learn again"
            )
        else:
            return
        ckpt = self.checkpointer
        ckpt.wait()
        culprit = [s for s in ckpt.steps() if s >= step - 1]
        if culprit and jax.process_index() == 0:
            for s in culprit:
                ckpt.mark_suspect(s, what)
        steps = [s for s in ckpt.steps() if not ckpt.suspect(s).exists() and s not in culprit]
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
            f"{what}; {marked}{where}. Lower train.lr (now {self.ctx.specs.optimizer.lr:g}), raise "
            f"train.warmup_steps or set train.clip_norm, then start again"
        )


def record_heldout(metrics, heldout: dict, step: int, loss: float | None, echo: bool = False):
    """Keep a held-out loss in ``heldout`` and the metrics (and on the console with ``echo``)."""
    heldout[step] = loss
    if loss is None:
        return
    ppl = math.exp(min(loss, 50))
    metrics.write(step, "heldout", {"loss": loss, "perplexity": ppl})
    if echo and jax.process_index() == 0:
        print(f"step {step:>6d} | held-out loss {loss:.4f} | ppl {ppl:.2f}", flush=True)


@dataclasses.dataclass(frozen=True)
class Rate:
    """A progress window's throughput: the window ended at ``t`` (time.time()) with ``step``;
    over it, tokens/s, its seconds and steps, and the share of them spent waiting for data."""

    t: float
    step: int
    tokens_per_s: float = 0.0
    seconds: float = 0.0
    steps: int = 0
    data_share: float = 0.0


def next_rate(last: Rate, now: float, ended: int, waited: float, tokens_per_step: int) -> Rate:
    """The window from ``last``'s end to step ``ended`` at ``now``, ``waited`` seconds of it in
    ``next(batches)``; ``last`` itself where ``ended`` was counted in it already (its rate
    stands)."""
    steps = ended - last.step
    if steps < 1:
        return last
    dt = now - last.t
    return Rate(
        now, ended, tokens_per_step * steps / max(dt, 1e-9), dt, steps, waited / max(dt, 1e-9)
    )


class _Window:
    """The loop's bookkeeping: steps' metrics fetched at log points (no per-step sync), the
    progress line and its throughput window (``Rate``). A log point's line is written once the
    next step is dispatched (``due``), so the device runs that step while the host reads the
    metrics and writes, and the window runs from one log point's step ending to the next's (or
    from the step after it, when that one had ended too by the time the line was read). The
    loop records what ``take`` returns; the window keeps only its own state."""

    def __init__(self, start_step: int):
        self.pending = []  # (step, metrics on device, batch ids)
        self.rate = Rate(time.time(), start_step)
        self.waited = 0.0  # seconds in next(batches) since the rate's end: inside the window
        self.due = None  # a log point's step whose line waits for the next dispatch

    def take(self, step: int) -> list[tuple[int, dict, list]]:
        """The steps up to ``step``: (step, metrics on the host, batch ids), in order."""
        done = [p for p in self.pending if p[0] <= step]
        self.pending = [p for p in self.pending if p[0] > step]
        self.due = None
        return [(s, jax.device_get(m), ids) for s, m, ids in done]

    def ended(self, step: int) -> tuple[float, int]:
        """(now, the last step ended): ``step``, or the one after it where that has ended too
        (a dispatch may return only once its step is nearly done: the device's queue is short)."""
        if self.pending and self.pending[0][0] == step + 1 and _ready(self.pending[0][1]):
            return time.time(), step + 1
        return time.time(), step

    def close(self, now: float, ended: int, tokens_per_step: int) -> Rate:
        """The window to ``ended`` at ``now``, which starts the next."""
        rate = next_rate(self.rate, now, ended, self.waited, tokens_per_step)
        if rate is not self.rate:  # waits are counted between two closes: inside the window
            self.waited = 0.0
        self.rate = rate
        return rate


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
