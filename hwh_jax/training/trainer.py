"""``train_and_evaluate(config, workdir)``: the whole pretraining run, cut into sections.

Read top to bottom: specs from the config (every check before any compile) -> mesh -> data ->
model and optimizer initialised from shapes straight into sharded arrays -> resume -> loop
(progress line, held-out evaluation, checkpoints, SIGTERM/SIGINT, non-finite guard) -> final
evaluation, loss plot and summary.json.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import signal
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import kernels_pallas
from hwh_jax.data.pipeline import DataSpec, build_splits, eval_batches, train_dataset
from hwh_jax.models.config import ModelConfig
from hwh_jax.models.lm import HybridLM
from hwh_jax.models.params import param_table
from hwh_jax.models.variants import model_config_from_dict
from hwh_jax.training import host_gc, profile
from hwh_jax.training import sharding as shd
from hwh_jax.training.checkpoint import Checkpointer, abstract_with_shardings
from hwh_jax.training.flops import flops_per_token, peak_flops
from hwh_jax.training.metrics import MetricsWriter, format_duration, plot_loss, progress_line
from hwh_jax.training.optimizer import OptimizerSpec, make_optimizer
from hwh_jax.training.steps import make_eval_step, make_train_step

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


class _Stop:
    """SIGTERM / SIGINT set a flag; the loop saves a checkpoint and returns cleanly."""

    def __init__(self):
        self.signal = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals cannot be caught here
                pass
        return self

    def _handle(self, signum, frame):
        self.signal = signal.Signals(signum).name
        log.warning("received %s: saving a checkpoint and stopping", self.signal)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


class _Tracer:
    """Traces the steps after ``at`` (``count`` of them, dispatched as the loop dispatches them)
    into ``out_dir`` and prints where their device time went beside their wall time
    (``hwh_jax.training.profile``; the summary also goes to ``out_dir/summary.json``). No log
    line falls inside the traced steps, so its wait is not in them."""

    def __init__(self, at: int, count: int, out_dir: Path):
        self.at, self.count, self.out_dir = at, count, Path(out_dir)
        self._ctx, self._t0 = None, 0.0

    def step(self, step: int, state) -> bool:
        """After dispatching ``step``: True while tracing."""
        if not self.at:
            return False
        if step == self.at:
            jax.block_until_ready(state)
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
            print(f"profile of steps {self.at + 1}-{step} (wall {wall_ms:.1f} ms a step, "
                  f"{self.out_dir}):\n{profile.format_summary(s, wall_ms)}", flush=True)
            return False
        return self._ctx is not None


# ---------------------------------------------------------------- specs (no compile yet)
def run_specs(config):
    """(DataSpec, OptimizerSpec) of a run config, every field checked (errors name the value)."""
    c = config.train
    data = DataSpec(**{k: (tuple(v) if isinstance(v, (list, tuple)) else v)
                       for k, v in config.data.to_dict().items()})
    data.validate()
    opt = OptimizerSpec(lr=c.lr, min_lr_ratio=c.min_lr_ratio, warmup_steps=c.warmup_steps,
                        total_steps=c.steps, schedule=c.schedule, decay_fraction=c.decay_fraction,
                        weight_decay=c.weight_decay, b1=c.b1, b2=c.b2, eps=c.eps,
                        clip_norm=c.clip_norm)
    opt.validate()
    if config.get("eval") is not None and config.eval.at_end:
        from hwh_jax.eval.suite import spec_from_config
        spec_from_config(config.eval).validate()
    if c.log_every < 1:
        raise ValueError(f"train.log_every must be >= 1, got {c.log_every}")
    if c.profile_at and c.profile_steps < 1:
        raise ValueError(f"train.profile_steps must be >= 1 with train.profile_at, got "
                         f"{c.profile_steps}")
    if c.profile_at and c.profile_at + c.profile_steps > (c.stop_at_step or c.steps):
        raise ValueError(f"train.profile_at={c.profile_at} + train.profile_steps="
                         f"{c.profile_steps} runs past the last step "
                         f"{c.stop_at_step or c.steps}")
    for name in ("eval_every", "checkpoint_every", "stop_at_step", "eval_batches", "profile_at"):
        if getattr(c, name) < 0:
            raise ValueError(f"train.{name} must be >= 0, got {getattr(c, name)}")
    if config.seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {config.seq_len}")
    if c.batch_size < 1 or c.grad_accum < 1 or c.batch_size % c.grad_accum:
        raise ValueError(f"train.batch_size={c.batch_size} must be a positive multiple of "
                         f"train.grad_accum={c.grad_accum}")
    return data, opt


def _model_config(config, tokenizer_vocab: int) -> ModelConfig:
    m = config.model.to_dict()
    if not m.get("vocab_size"):
        m["vocab_size"] = -(-tokenizer_vocab // 64) * 64  # the tokenizer's, padded to 64
    cfg = model_config_from_dict(m)
    if cfg.vocab_size < tokenizer_vocab:
        raise ValueError(f"model.vocab_size={cfg.vocab_size} is smaller than the tokenizer's "
                         f"vocabulary ({tokenizer_vocab})")
    return cfg


def _check_seq_len(cfg: ModelConfig, seq_len: int):
    if cfg.attn_impl == "splash" and seq_len % 128:
        raise ValueError(f"seq_len={seq_len}: attn_impl='splash' needs a multiple of 128")


def unigram_entropy(stream: np.ndarray) -> float:
    """Entropy (nats/token) of the corpus' unigram distribution: the loss of a model that
    ignores context, which a language model must beat."""
    counts = np.bincount(np.asarray(stream, np.int64))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def _put(batch, sharding):
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
            for k, v in batch.items() if k != "index"}


def init_train_state(cfg: ModelConfig, tx, seed) -> dict:
    """The checkpointed train state: params, optimizer state, step, rng, non-finite marker.

    Under ``jit`` pass ``seed`` as an argument (a traced int32), not a Python constant: with a
    constant key XLA constant-folds the whole random initialisation at compile time (minutes
    for a 100M-parameter model on a GPU)."""
    key = jax.random.key(seed)
    params = nnx.state(HybridLM(cfg, rngs=nnx.Rngs(key)), nnx.Param)
    return {"params": params, "opt_state": tx.init(params), "step": jnp.int32(0),
            "rng": jax.random.key_data(key), "bad_step": jnp.int32(-1)}


def train_state_shardings(cfg: ModelConfig, tx, mesh):
    """(graphdef, abstract train state, its shardings) of ``cfg`` on ``mesh``: parameters by
    their logical axis names (``sharding.RULES``), optimizer moments as their parameters,
    scalars replicated."""
    graphdef, abstract_params = nnx.split(
        nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0))), nnx.Param)
    param_sh = shd.state_shardings(abstract_params, mesh)
    repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    abstract_state = jax.eval_shape(lambda s: init_train_state(cfg, tx, s), jnp.int32(0))
    # optimizer moments mirror the params' shardings (same tree under mu / nu)
    opt_sh = _mirror_shardings(abstract_state["opt_state"], abstract_params, param_sh, repl)
    return graphdef, abstract_state, {"params": param_sh, "opt_state": opt_sh, "step": repl,
                                      "rng": repl, "bad_step": repl}


def jit_step(step_fn, mesh, first_sh, **jit_kw):
    """``step_fn(first, batch)`` jitted as the trainer runs it on ``mesh``: the Pallas kernels
    per device shard (``kernel_mesh``), ``first`` (the train state, or the parameters for the
    eval step) in ``first_sh``, the batch's rows over the batch axes; ``jit_kw`` (out_shardings,
    donate_argnums) go to ``jax.jit``."""
    return jax.jit(kernels_pallas.kernel_mesh(mesh)(step_fn),
                   in_shardings=(first_sh, shd.batch_sharding(mesh)), **jit_kw)


@contextlib.contextmanager
def threefry_kernel():
    """Lower the threefry PRNG to its one-kernel form on GPU instead of to XLA ops (the same
    bits; no effect on other backends). The initialisation is ~500 random draws for HwH-380m,
    each otherwise a threefry expansion in the program: on two H200s 168 s passed between the
    data and the model log lines of ``launch.train`` at 380m, most of it compiling the init
    (72 s on this project's CPU machine, where the flag changes nothing)."""
    before = jax.config.jax_threefry_gpu_kernel_lowering
    jax.config.update("jax_threefry_gpu_kernel_lowering", True)
    try:
        yield
    finally:
        jax.config.update("jax_threefry_gpu_kernel_lowering", before)


def model_from_config(config, tokenizer_vocab: int) -> ModelConfig:
    """The run's ModelConfig (vocabulary from the tokenizer when the config leaves it 0)."""
    return _model_config(config, tokenizer_vocab)


# ---------------------------------------------------------------- the run
def train_and_evaluate(config, workdir: str | Path) -> RunResult:
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    c = config.train
    data_spec, opt_spec = run_specs(config)

    # --- mesh
    mesh = shd.make_mesh(tuple(c.mesh))
    dp = shd.data_parallel_size(mesh)
    if (c.batch_size // c.grad_accum) % dp:
        raise ValueError(f"micro-batch {c.batch_size // c.grad_accum} (train.batch_size / "
                         f"train.grad_accum) does not divide over the data-parallel size {dp} "
                         f"of mesh {dict(mesh.shape)}")
    if c.batch_size % jax.process_count():
        raise ValueError(f"train.batch_size={c.batch_size} not divisible by "
                         f"{jax.process_count()} processes")

    # --- data
    t0 = time.time()
    splits = build_splits(data_spec, config.seq_len)
    cfg = _model_config(config, splits.tokenizer.vocab_size)
    _check_seq_len(cfg, config.seq_len)
    entropy = unigram_entropy(splits.train.stream)
    log.info("data: train %r, held-out %r, tokenizer %s (%d), unigram entropy %.3f nats "
             "(%.1fs)", splits.train, splits.heldout, splits.tokenizer.name,
             splits.tokenizer.vocab_size, entropy, time.time() - t0)
    train_iter = iter(train_dataset(splits.train, global_batch=c.batch_size, seed=config.seed,
                                    process_index=jax.process_index(),
                                    process_count=jax.process_count(),
                                    workers=data_spec.workers))

    # --- model and optimizer, from shapes into sharded arrays
    tx, schedule = make_optimizer(opt_spec)
    graphdef, abstract_state, state_sh = train_state_shardings(cfg, tx, mesh)
    param_sh = state_sh["params"]

    def init_state(seed):
        return init_train_state(cfg, tx, seed)

    seed = jnp.int32(config.seed)
    ckpt = Checkpointer(workdir, keep=c.keep_checkpoints)
    restored = ckpt.restore(abstract_with_shardings(abstract_state, state_sh))
    if restored is None:
        with threefry_kernel():
            t_init = time.time()
            state = jax.block_until_ready(jax.jit(init_state, out_shardings=state_sh)(seed))
        log.info("initialised the train state in %.1fs", time.time() - t_init)
        start = 0
    else:
        start, state, data_state, _ = restored
        train_iter.set_state(data_state)
        log.info("resumed from step %d in %s", start, ckpt.directory)

    p = param_table(cfg)
    fpt = flops_per_token(cfg, config.seq_len)
    kind = jax.devices()[0].device_kind
    peak = c.peak_flops or peak_flops(kind)
    peak_total = peak * jax.device_count() if peak else None
    log.info("model %s: %s params, FA %s / LA %s per layer; %.3g FLOPs/token; mesh %s on %d x %s",
             cfg.arch, f"{p['total']:,}", cfg.fa_heads, cfg.la_heads, fpt, dict(mesh.shape),
             jax.device_count(), kind)

    # --- steps
    batch_sh = shd.batch_sharding(mesh)
    step_fn = make_train_step(graphdef, tx, schedule, grad_accum=c.grad_accum, z_loss=c.z_loss,
                              document_mask=c.document_mask)
    train_step = jit_step(step_fn, mesh, state_sh, out_shardings=(state_sh, None),
                          donate_argnums=(0,))
    eval_step = jit_step(make_eval_step(graphdef, document_mask=c.document_mask), mesh, param_sh)

    def evaluate(params):
        if splits.heldout is None:
            return None
        total, count = 0.0, 0.0
        for b in eval_batches(splits.heldout, batch=c.batch_size // c.grad_accum,
                              max_batches=c.eval_batches or None):
            s, n = eval_step(params, _put(b, batch_sh))
            total, count = total + float(s), count + float(n)
        return total / max(count, 1.0)

    writer = MetricsWriter(workdir, enabled=jax.process_index() == 0)
    meta = {"config": json.loads(config.to_json_best_effort()), "arch": cfg.arch}
    losses, batch_ids, heldout = {}, {}, {}
    pending = []  # (step, metrics on device, batch ids): fetched at log points, no per-step sync
    stop_at = c.stop_at_step or c.steps
    tokens_per_step = c.batch_size * config.seq_len
    t_last, step_last = time.time(), start
    data_wait = 0.0  # seconds spent in next(train_iter) since the last log line
    stopped_early = False

    def save(step):
        bad = int(state["bad_step"])
        if bad >= 0:
            raise FloatingPointError(f"non-finite loss or gradient at step {bad}; the last "
                                     f"good checkpoint stays in {ckpt.directory}")
        ckpt.save(step, state, train_iter.get_state(), {**meta, "step": step})

    def flush(step):
        nonlocal t_last, step_last, data_wait
        for s, m, ids in pending:
            m = jax.device_get(m)
            losses[s] = float(m["loss"])
            batch_ids[s] = ids
            writer.write(s, "train", {k: m[k] for k in ("loss", "grad_norm", "lr")})
        bad = int(state["bad_step"])
        if bad >= 0:
            raise FloatingPointError(f"non-finite loss or gradient at step {bad} (the update "
                                     f"was skipped); the last good checkpoint stays in "
                                     f"{ckpt.directory}")
        if pending:
            dt = time.time() - t_last
            tps = tokens_per_step * (step - step_last) / max(dt, 1e-9)
            mfu = fpt * tps / peak_total if peak_total else None
            eta = (stop_at - step) * dt / max(step - step_last, 1)
            share = data_wait / max(dt, 1e-9)
            print(progress_line(step, c.steps, jax.device_get(pending[-1][1]), tps, mfu, eta,
                                share), flush=True)
            writer.write(step, "perf", {"tokens_per_s": tps, "data_wait_share": share,
                                        **({"mfu": mfu} if mfu else {})})
            t_last, step_last, data_wait = time.time(), step, 0.0
        pending.clear()

    tracer = _Tracer(c.profile_at, c.profile_steps, workdir / "profile")
    if c.profile_at and c.profile_at <= start:
        log.warning("train.profile_at=%d is not after step %d, where this run resumes: nothing "
                    "will be traced", c.profile_at, start)
    with _Stop() as stop:
        step = start
        while step < stop_at:
            t_data = time.time()
            batch = next(train_iter)
            data_wait += time.time() - t_data
            ids = batch["index"].tolist()
            state, m = train_step(state, _put(batch, batch_sh))
            step += 1
            if step == start + 1:   # compiled: later collections skip what setup built
                log.info("froze %d objects out of the garbage collector's walks (host_gc)",
                         host_gc.freeze())
            tracing = tracer.step(step, state)
            pending.append((step, m, ids))
            if (step % c.log_every == 0 or step == stop_at) and not tracing:
                flush(step)
            if c.eval_every and step % c.eval_every == 0 and step < c.steps:
                flush(step)
                heldout[step] = evaluate(state["params"])
                if heldout[step] is not None:
                    writer.write(step, "heldout", {"loss": heldout[step],
                                                   "perplexity": math.exp(min(heldout[step], 50))})
                    print(f"step {step:>6d} | held-out loss {heldout[step]:.4f} | "
                          f"ppl {math.exp(min(heldout[step], 50)):.2f}", flush=True)
            if c.checkpoint_every and step % c.checkpoint_every == 0:
                flush(step)
                save(step)
            if stop.signal:
                flush(step)
                save(step)
                stopped_early = True
                print(f"stopped by {stop.signal} at step {step}; checkpoint saved", flush=True)
                break
        flush(step)
        if step == stop_at and step not in ckpt.steps():
            save(step)
        stopped_early = stopped_early or step < c.steps
    host_gc.unfreeze()   # what the run built can be collected again once it is dropped

    final = None
    if step >= c.steps and c.final_eval:
        final = heldout[step] = evaluate(state["params"])
        if final is not None:
            writer.write(step, "heldout", {"loss": final, "perplexity": math.exp(min(final, 50))})
    summary = {
        "arch": cfg.arch, "params": p["total"], "steps": step, "tokens": step * tokens_per_step,
        "final_heldout_loss": final, "unigram_entropy": entropy,
        "last_train_loss": losses[max(losses)] if losses else None,
        "wall_s": time.time() - t0, "devices": f"{jax.device_count()} x {kind}",
        "mesh": dict(mesh.shape), "flops_per_token": fpt,
    }
    evaluation = None
    if step >= c.steps and config.get("eval") is not None and config.eval.at_end \
            and jax.process_index() == 0:
        # the training's summary first: a run cut during its evaluation keeps it
        (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
        evaluation = _final_suite(config, cfg, graphdef, state["params"], splits, workdir, step)
        summary["wall_s"] = time.time() - t0
    if evaluation is not None:
        summary["eval"] = {k: evaluation[k] for k in ("niah_summary", "wall_s") if k in evaluation}
    if jax.process_index() == 0:
        (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
        if not stopped_early:
            plot_loss(workdir / "metrics.jsonl", workdir / "loss.png",
                      title=f"{cfg.arch}: {step} steps x {tokens_per_step} tokens",
                      reference={"unigram entropy": entropy})
        if final is not None:
            print(f"done: {step} steps, held-out loss {final:.4f} (ppl {math.exp(final):.2f}) vs "
                  f"unigram entropy {entropy:.4f}; wall {format_duration(summary['wall_s'])}; "
                  f"outputs in {workdir}", flush=True)
    writer.close()
    ckpt.close()
    return RunResult(step, losses, batch_ids, heldout, stopped_early, summary)


def _final_suite(config, cfg, graphdef, params, splits, workdir: Path, step: int) -> dict:
    """The config's ``eval`` section on the final model (NIAH, perplexity by position, ...)."""
    from hwh_jax.eval.suite import run_suite, spec_from_config
    from hwh_jax.training.restore import LoadedRun
    spec = spec_from_config(config.eval)
    run = LoadedRun(nnx.merge(graphdef, params), cfg, splits.tokenizer, config, step, workdir)
    print(f"evaluating the final model: {', '.join(spec.suites)} -> {workdir / 'eval'}",
          flush=True)
    stream = None if splits.heldout is None else np.asarray(splits.heldout.stream)
    out = run_suite(run, spec, workdir / "eval", heldout_stream=stream)
    if "niah_summary" in out:
        print("NIAH: " + ", ".join(f"{k} {v:.0f}" for k, v in out["niah_summary"].items()),
              flush=True)
    return out


def _mirror_shardings(opt_state, params, param_sh, repl):
    """Shard every optimizer leaf whose path ends like a param path the way that param is;
    scalars (counts) and anything else are replicated."""
    flat_p = {_suffix(path): sh for path, sh in
              jax.tree_util.tree_flatten_with_path(param_sh)[0]}
    shapes = {_suffix(path): x.shape for path, x in
              jax.tree_util.tree_flatten_with_path(params)[0]}

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
