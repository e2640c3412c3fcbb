"""The training pipeline: resume equivalence, mesh invariance, signals, NaN guard, bad input."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import base
from hwh_jax.data.paths import resolve
from hwh_jax.data.sources import read_text
from hwh_jax.models.variants import ARCHS, SIZES
from hwh_jax.training.trainer import train_and_evaluate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A 200 kB slice of tinyshakespeare and a cache dir shared by this module's runs."""
    root = tmp_path_factory.mktemp("corpus")
    path = root / "shakespeare.txt"
    path.write_text(read_text(resolve("tinyshakespeare/input.txt.gz"))[:200_000])
    os.environ["HWH_CACHE_DIR"] = str(root / "cache")
    return path


def small_config(corpus, arch="transformer", **train):
    """The Transformer unless said: the trainer's logic here does not depend on the mixer, and
    it compiles fastest (the hybrid's layers train in test_every_config_builds_... and the mesh
    tests)."""
    config = base.get_config(f"{arch}_tiny")
    config.seq_len = 32
    config.model.dtype = "float32"
    config.model.la_chunk_size = 16
    config.data.paths = (str(corpus),)
    config.data.sp_vocab_size = 512
    config.data.heldout_fraction = 0.05
    t = config.train
    t.steps, t.batch_size, t.lr, t.warmup_steps = 6, 8, 3e-3, 2
    t.log_every, t.eval_every, t.checkpoint_every, t.eval_sequences = 1, 0, 0, 16
    t.mesh = (1, 1, 1)  # one device: multi-device runs are test_meshes_agree_...'s business
    config.eval.at_end = False  # the evaluation suite after training: tests/launch/test_launch.py
    for k, v in train.items():
        setattr(t, k, v)
    return config


def test_resume_is_bitwise_identical(corpus, tmp_path):
    """Six steps straight against three, a stop, and three more: every loss and batch equal.
    (The Transformer: resuming restores the state and the data position whatever the mixer;
    it compiles fastest.)"""
    straight = train_and_evaluate(small_config(corpus, "transformer"), tmp_path / "a")
    first = train_and_evaluate(small_config(corpus, "transformer", stop_at_step=3), tmp_path / "b")
    assert first.stopped_early and first.final_step == 3
    second = train_and_evaluate(small_config(corpus, "transformer"), tmp_path / "b")
    resumed = {**first.losses, **second.losses}
    assert sorted(second.losses) == [4, 5, 6]
    assert resumed == straight.losses  # bitwise: float equality of every step's loss
    assert {**first.batch_ids, **second.batch_ids} == straight.batch_ids
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["steps"] == 6 and (tmp_path / "a" / "loss.png").exists()
    rows = [json.loads(l) for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"] for r in rows} >= {"train", "heldout", "perf"}
    perf = [r for r in rows if r["split"] == "perf"]
    shares = [r["data_wait_share"] for r in perf]  # time in next(batches), within its window
    assert perf and all(0 <= x <= 1 for x in shares) and any(x > 0 for x in shares), shares
    assert list((tmp_path / "a" / "tensorboard").glob("events.out.tfevents.*"))


MESH_TIMEOUT_S = 300


def _train_in_subprocess(corpus, workdir, mesh, devices=8, extra=()):
    """launch.train on ``devices`` fake CPU devices in a fresh process; the per-step train
    losses of every run in ``workdir``."""
    from conftest import XLA_TEST_FLAGS

    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} {XLA_TEST_FLAGS}",
    }
    args = [
        sys.executable,
        "-m",
        "launch.train",
        "--config=configs/hwh_tiny.py",
        "--config.seq_len=32",
        "--config.model.dtype=float32",
        "--config.model.la_chunk_size=16",
        f"--config.data.paths=('{corpus}',)",
        "--config.data.sp_vocab_size=512",
        "--config.data.heldout_fraction=0.05",
        "--config.train.steps=3",
        "--config.train.batch_size=8",
        "--config.train.lr=3e-3",
        "--config.train.warmup_steps=2",
        "--config.train.log_every=1",
        "--config.train.eval_every=0",
        "--config.train.checkpoint_every=0",
        "--config.train.final_eval=False",
        "--config.eval.at_end=False",
        f"--config.train.mesh={mesh}",
        "--config.train.allow_unsplit_heads=True",
        f"--workdir={workdir}",
        *extra,
    ]
    out = subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=MESH_TIMEOUT_S
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def test_meshes_agree_and_a_checkpoint_moves_between_them(corpus, tmp_path):
    """HwH in fp32 on 8 fake CPU devices: a 2x2x2 mesh (data, fsdp, tensor) trains steps 1-2
    and stops with a checkpoint; a 1x2x4 mesh restores it (orbax reshards) and trains step 3.
    Every step's loss agrees with the uninterrupted single-device run. (Moving to fewer devices
    and processes: tests/training/test_multiprocess.py.)"""
    ref = _train_in_subprocess(corpus, tmp_path / "ref", "1,1,1", devices=1)
    assert sorted(ref) == [1, 2, 3]
    first = _train_in_subprocess(
        corpus, tmp_path / "run", "2,2,2", extra=["--config.train.stop_at_step=2"]
    )
    assert sorted(first) == [1, 2] and (tmp_path / "run" / "checkpoints" / "2").exists()
    resumed = _train_in_subprocess(corpus, tmp_path / "run", "1,2,4")
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3]  # step 3 only, resumed
    for step, loss in ref.items():
        assert abs(resumed[step] - loss) <= 1e-5 * abs(loss), (step, resumed[step], loss)


def test_summary_is_written_before_the_closing_evaluation(corpus, tmp_path, monkeypatch):
    """A run killed during its closing evaluation (a time limit) still leaves summary.json."""
    from hwh_jax.training import trainer

    def killed(*args, **kw):
        raise TimeoutError("the job's time limit")

    monkeypatch.setattr(trainer, "run_suite", killed)
    config = small_config(corpus, steps=2)
    config.eval.at_end, config.eval.suites = True, ("ppl",)
    with pytest.raises(TimeoutError):
        train_and_evaluate(config, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["final_heldout_loss"] > 0 and "eval" not in summary


def test_a_log_line_is_written_with_the_next_step_queued(corpus, tmp_path, monkeypatch, capsys):
    """log_every=2 over 5 steps: the lines of steps 2 and 4 are printed after steps 3 and 5 are
    dispatched (the device is never left idle while the host reads metrics and writes), the last
    step's at once; every line's figures are those of its own step."""
    from hwh_jax.training import trainer

    real = trainer.compile_steps

    def compile_steps(*args):
        steps = real(*args)
        step = steps.train_step

        def dispatch(state, batch):
            print("dispatched", flush=True)
            return step(state, batch)

        return dataclasses.replace(steps, train_step=dispatch)

    monkeypatch.setattr(trainer, "compile_steps", compile_steps)
    got = train_and_evaluate(small_config(corpus, steps=5, log_every=2), tmp_path)
    printed = [
        l for l in capsys.readouterr().out.splitlines() if l.startswith(("dispatched", "step "))
    ]
    assert [l.split(" |")[0] for l in printed] == ["dispatched"] * 3 + ["step      2/5"] + [
        "dispatched"
    ] * 2 + ["step      4/5", "step      5/5"]
    for line in printed[3], printed[6], printed[7]:
        step, loss = int(line.split("/")[0].split()[1]), line.split("loss ")[1].split()[0]
        assert loss == f"{got.losses[step]:.4f}"
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r["loss"] for r in rows if r["split"] == "train"}
    assert train == got.losses and sorted(train) == [1, 2, 3, 4, 5]
    assert [r["step"] for r in rows if r["split"] == "perf"] == [2, 4, 5]


def test_the_rate_counts_a_step_that_ended_before_its_line(corpus, tmp_path, monkeypatch):
    """A dispatch that returns only once its step is done (a short device queue) and takes at
    least 0.3 s: each window counts the steps that ended in it, so no line's tokens/s exceeds
    a step's tokens over 0.3 s (counting the last step twice over nearly no time did)."""
    from hwh_jax.training import trainer

    real = trainer.compile_steps

    def compile_steps(*args):
        steps = real(*args)
        step = steps.train_step

        def dispatch(state, batch):
            out = jax.block_until_ready(step(state, batch))
            time.sleep(0.3)
            return out

        return dataclasses.replace(steps, train_step=dispatch)

    monkeypatch.setattr(trainer, "compile_steps", compile_steps)
    config = small_config(corpus, steps=5, log_every=2)
    train_and_evaluate(config, tmp_path)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    perf = {r["step"]: r["tokens_per_s"] for r in rows if r["split"] == "perf"}
    assert sorted(perf) == [2, 4, 5]
    bound = config.train.batch_size * config.seq_len / 0.3
    assert all(0 < v <= bound for v in perf.values()), (perf, bound)
    assert perf[5] == perf[4]  # step 5 had ended when step 4's line was read


def test_nan_stops_with_step_and_keeps_last_good_checkpoint(corpus, tmp_path):
    config = small_config(
        corpus,
        steps=30,
        lr=1e12,
        clip_norm=0.0,
        warmup_steps=0,
        checkpoint_every=1,
        weight_decay=0.0,
    )
    with pytest.raises(FloatingPointError, match=r"at step \d+"):
        train_and_evaluate(config, tmp_path)
    steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert steps, "no good checkpoint kept"


def test_unreadable_latest_checkpoint_falls_back(corpus, tmp_path, caplog):
    train_and_evaluate(small_config(corpus, steps=4, checkpoint_every=2), tmp_path)
    latest = tmp_path / "checkpoints" / "4"
    for f in (latest / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    res = train_and_evaluate(small_config(corpus, steps=5, checkpoint_every=2), tmp_path)
    assert "unreadable" in caplog.text and sorted(res.losses) == [3, 4, 5]


def test_sigterm_saves_a_checkpoint_that_resumes(corpus, tmp_path):
    workdir = tmp_path / "run"
    # the Transformer: the signal's path does not depend on the mixer, and it compiles fastest
    args = [
        sys.executable,
        "-m",
        "launch.train",
        "--config=configs/base.py:transformer_tiny",
        f"--workdir={workdir}",
        "--config.seq_len=32",
        "--config.model.dtype=float32",
        "--config.model.la_chunk_size=16",
        "--config.data.heldout_fraction=0.05",
        f"--config.data.paths=('{corpus}',)",
        "--config.data.sp_vocab_size=512",
        "--config.train.steps=100000",
        "--config.train.batch_size=4",
        "--config.train.log_every=1",
        "--config.train.eval_every=0",
        "--config.train.checkpoint_every=0",
        "--config.eval.at_end=False",
        "--config.train.stop_exit_status=75",
    ]  # what a supervisor loop relaunches on
    from conftest import XLA_TEST_FLAGS

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": XLA_TEST_FLAGS}
    proc = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step") and "/100000" in line and "step      3/" in line:
            proc.send_signal(signal.SIGTERM)
            break
    out = "".join(lines) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 75, out[-3000:]
    assert "stopped by SIGTERM" in out
    steps = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps and min(steps) >= 3
    config = small_config(corpus, arch="transformer", steps=max(steps) + 1)
    config.train.batch_size = 4
    res = train_and_evaluate(config, workdir)
    assert sorted(res.losses) == [max(steps) + 1]


def test_wandb_logs_offline_and_a_resumed_run_continues_its_run(corpus, tmp_path, monkeypatch):
    """train.loggers=tensorboard,wandb in W&B's offline mode: the run's id is kept in the
    workdir, a resumed start logs into the same W&B run, and the scalars and config are in its
    offline record; jsonl and TensorBoard as always."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    workdir = tmp_path / "run"
    train_and_evaluate(
        small_config(corpus, loggers="tensorboard,wandb", stop_at_step=3, checkpoint_every=3),
        workdir,
    )
    run_id = (workdir / "wandb_run_id").read_text().strip()
    train_and_evaluate(small_config(corpus, loggers="tensorboard,wandb"), workdir)
    assert (workdir / "wandb_run_id").read_text().strip() == run_id
    runs = sorted((workdir / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)
    records = b"".join(f.read_bytes() for r in runs for f in r.glob("*.wandb"))
    assert b"train/loss" in records and b"transformer" in records
    assert list((workdir / "tensorboard").glob("events.out.tfevents.*"))


def test_an_unknown_logger_is_refused_before_anything_runs(corpus, tmp_path):
    with pytest.raises(ValueError, match="train.loggers='tensorbord'.*choose from"):
        train_and_evaluate(small_config(corpus, loggers="tensorbord"), tmp_path)
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda c: setattr(c.data, "paths", ("missing/corpus.txt",)), "missing/corpus.txt"),
        (lambda c: setattr(c.train, "mesh", (3, 1, 1)), "does not divide the 8 devices"),
        (lambda c: setattr(c.train, "batch_size", 6), "data x fsdp = 8 devices"),
        (lambda c: setattr(c, "seq_len", 1), "seq_len"),
        (lambda c: setattr(c.train, "schedule", "linear"), "schedule"),
        (lambda c: setattr(c.model, "vocab_size", 100), "vocab_size=100"),
        (lambda c: setattr(c.train, "profile_at", 5), "profile_at=5"),
    ],
    ids=["path", "mesh", "batch", "seq_len", "schedule", "vocab", "profile"],
)
def test_bad_input_fails_early_naming_the_value(corpus, tmp_path, change, match):
    config = small_config(corpus, mesh=(-1, 1, 1))
    change(config)
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        train_and_evaluate(config, tmp_path)
    assert not (tmp_path / "checkpoints" / "1").exists()


def test_unknown_config_key_is_rejected():
    config = base.get_config("hwh_tiny")
    with pytest.raises(AttributeError, match="lr_max"):
        config.train.lr_max = 1.0


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_every_config_builds_and_its_tiny_form_trains_a_step(arch):
    """Every base.get_config("<arch>_<size>") builds (from shapes); the arch's tiny form takes a step,
    except the allocation and position variants of an architecture that does (hwh_rope,
    hwh_uniform, layerwise_nope, swa_nope: the same layers, other head counts or RoPE flags)."""
    import jax.numpy as jnp
    from flax import nnx

    from hwh_jax.models.lm import HybridLM
    from hwh_jax.models.params import count_params
    from hwh_jax.models.variants import model_config_from_dict
    from hwh_jax.training.optimizer import OptimizerSpec, make_optimizer
    from hwh_jax.training.steps import make_train_step

    for size in SIZES:
        assert count_params(model_config_from_dict(base.get_config(f"{arch}_{size}").model)) > 0
    if arch in ("hwh_rope", "hwh_uniform", "layerwise_nope", "swa_nope"):
        return
    config = base.get_config(f"{arch}_tiny")
    config.model.la_chunk_size = 16
    cfg = model_config_from_dict(config.model)
    graphdef, params = nnx.split(HybridLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    tx, schedule = make_optimizer(OptimizerSpec(lr=1e-3, warmup_steps=0, total_steps=10))
    state = {
        "params": params,
        "opt_state": tx.init(params),
        "step": jnp.int32(0),
        "rng": jnp.zeros((2,), jnp.uint32),
        "bad_step": jnp.int32(-1),
    }
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (2, 33))
    batch = {
        "inputs": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "segment_ids": np.ones((2, 32), np.int32),
        "positions": np.tile(np.arange(32), (2, 1)),
        "loss_mask": np.ones((2, 32), np.float32),
    }
    new_state, m = jax.jit(make_train_step(graphdef, tx, schedule))(state, batch)
    assert np.isfinite(float(m["loss"])) and int(new_state["step"]) == 1
    assert int(new_state["bad_step"]) == -1


def test_experiment_configs_match_parameters_and_tokens():
    """configs/experiment.py: the six architectures of the reproduction at `small` have the same
    parameter count within 5% (at the vocabulary a 8192-piece tokenizer gives), train on the
    same number of tokens at L and 2L in micro-batches of 8,192 tokens, and end with the retrieval probe, NIAH at L, 2L, 4L, MQAR
    and perplexity."""
    from configs import experiment
    from hwh_jax.models.params import count_params
    from hwh_jax.training.specs import model_for_run

    params, tokens = {}, set()
    for arch in experiment.ARCHS:
        for L in (512, 1024):
            config = experiment.get_config(f"{arch},{L}")
            tokens.add(config.train.steps * config.train.batch_size * config.seq_len)
            assert tuple(config.eval.niah_factors) == (1, 2, 4)
            assert set(config.eval.suites) == {"retrieval", "niah", "mqar", "ppl"}
            assert 0 < config.data.retrieval_share < 1
            # one split everywhere: micro-batches of 8,192 tokens, whatever memory a run has
            micro = config.train.batch_size // config.train.grad_accum * config.seq_len
            assert micro == 8192, (arch, L, config.train.grad_accum)
        params[arch] = count_params(model_for_run(config, 8192))
    assert len(tokens) == 1, tokens
    spread = (max(params.values()) - min(params.values())) / min(params.values())
    assert spread <= 0.05, params
    with pytest.raises(ValueError, match="'swa2' is not one of"):
        experiment.get_config("swa2")


def test_the_cpu_experiment_preset_is_the_experiment_at_the_tiny_size():
    """ARCH,L,cpu: the same data mix and evaluation suites at the `tiny` size and CPU scale;
    any other third value is refused naming the one preset."""
    from configs import experiment

    cpu, full = experiment.get_config("hwh,256,cpu"), experiment.get_config("hwh,256")
    assert cpu.model.size == "tiny" and full.model.size == "small"
    assert (cpu.train.steps, cpu.train.batch_size, cpu.data.workers) == (300, 16, 0)
    assert cpu.data.retrieval_share == full.data.retrieval_share
    assert set(cpu.eval.suites) == set(full.eval.suites)
    assert experiment.get_config("layerwise/gla/3,256,cpu").model.size == "tiny"
    with pytest.raises(ValueError, match="'gpu'.*'cpu'"):
        experiment.get_config("hwh,256,gpu")


def test_experiment_configs_take_the_zoo_forms():
    """configs/experiment.py:FORM/KIND[/R]: every linear-head kind layer-wise at 3:1 and
    head-wise trains the reproduction's tokens on the same data and evaluation, with parameters
    within 5% of the Transformer's; a bad form names itself."""
    from configs import experiment
    from hwh_jax.layers import heads
    from hwh_jax.models.params import count_params
    from hwh_jax.training.specs import model_for_run

    ref = experiment.get_config("transformer")
    want = count_params(model_for_run(ref, 8192))
    for kind in heads.ORDER:
        for form in (f"layerwise/{kind}/3", f"hwh/{kind}"):
            config = experiment.get_config(f"{form},512")
            assert config.model.la_kind == kind
            assert (config.train.steps, config.train.batch_size, config.seq_len) == (
                ref.train.steps,
                ref.train.batch_size,
                ref.seq_len,
            )
            assert config.data.to_dict() == ref.data.to_dict()
            assert config.eval.to_dict() == ref.eval.to_dict()
            cfg = model_for_run(config, 8192)
            shown = form.split("/")[0] + ("" if kind == "gdn" else f"/{kind}")
            assert cfg.arch == shown, (form, cfg.arch)  # the name in logs and reports
            got = count_params(cfg)
            assert abs(got - want) <= 0.05 * want, (form, got, want)
        assert experiment.get_config(f"layerwise/{kind}/3").model.ratio == (1, 3)
    with pytest.raises(ValueError, match="experiment.py:hwh/lstm.*'lstm'"):
        experiment.get_config("hwh/lstm")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cross_entropy_matches_autodiff_of_the_plain_formula(dtype):
    """token_nll's hand-written backward (d logits in the logits' dtype, one pass) against
    autodiff of the fp32 formula, with a mask and the z-loss; bf16 logits within bf16 rounding."""
    import jax.numpy as jnp

    from hwh_jax.layers.loss import cross_entropy

    def plain(logits, targets, mask, z_loss):
        l32 = logits.astype(jnp.float32)
        logz = jax.nn.logsumexp(l32, axis=-1)
        nll = logz - jnp.take_along_axis(l32, targets[..., None], axis=-1)[..., 0]
        count = jnp.maximum(mask.sum(), 1.0)
        return ((nll * mask).sum() + z_loss * ((logz**2) * mask).sum()) / count

    rng = np.random.default_rng(0)
    logits = jnp.asarray(3 * rng.standard_normal((2, 5, 37)), dtype)
    targets = jnp.asarray(rng.integers(0, 37, (2, 5)), jnp.int32)
    mask = jnp.asarray(rng.random((2, 5)) > 0.3, jnp.float32)
    ours = lambda l: sum(cross_entropy(l, targets, mask, 1e-2)[:2])
    want_v, want_g = jax.value_and_grad(plain)(logits, targets, mask, 1e-2)
    got_v, got_g = jax.value_and_grad(ours)(logits)
    assert got_g.dtype == logits.dtype
    np.testing.assert_allclose(float(got_v), float(want_v), rtol=1e-6)
    tol = 1e-6 if dtype == "float32" else 8e-3  # bf16: both round the same fp32 values once
    np.testing.assert_allclose(
        np.asarray(got_g, np.float32),
        np.asarray(want_g, np.float32),
        rtol=tol,
        atol=tol * float(jnp.abs(want_g.astype(jnp.float32)).max()),
    )
    assert float(jnp.abs(got_g.astype(jnp.float32)).sum()) > 0


def test_host_gc_freeze_keeps_later_garbage_collectable_and_times_collections():
    import gc
    import weakref

    from hwh_jax.profiling import host_gc

    class Node:
        pass

    before = Node()
    before.self = before  # a cycle alive at freeze time
    try:
        frozen = host_gc.freeze()
        # another thread may free a frozen object meanwhile; nothing else freezes
        assert 0 < gc.get_freeze_count() <= frozen
        after = Node()
        after.self = after  # a cycle made after the freeze
        ref_after, ref_before = weakref.ref(after), weakref.ref(before)
        del after, before
        with host_gc.GcPauses() as pauses:
            gc.collect()
        assert ref_after() is None  # later garbage is still collected
        assert ref_before() is not None  # the frozen cycle is skipped until unfreeze
        assert [g for g, _ in pauses.events] == [2] and pauses.events[0][1] >= 0
        assert pauses.summary()["gen2"]["count"] == 1
    finally:
        host_gc.unfreeze()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref_before() is None  # unfrozen: collectable again


def test_profile_traces_the_steps_asked_and_keeps_the_run_unchanged(corpus, tmp_path, capsys):
    plain = train_and_evaluate(small_config(corpus, steps=5), tmp_path / "plain")
    traced = train_and_evaluate(
        small_config(corpus, steps=5, profile_at=2, profile_steps=2), tmp_path / "traced"
    )
    assert traced.losses == plain.losses  # tracing changes no number
    summary = json.loads((tmp_path / "traced" / "profile" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["step_ms"] > 0
    assert "profile of steps 3-4" in capsys.readouterr().out


def test_the_ratio_grid_names_its_cells_and_refuses_a_cell_before_training():
    """launch.experiment's grid: a cell per (kind, ratio), each a layer-wise config of
    configs/experiment.py; an unknown kind or a ratio leaving no FA layer is refused up front."""
    from configs.experiment import get_config
    from hwh_jax.experiments.runner import grid_cells

    assert grid_cells(get_config, ["gdn", "gla"], ["1", "3"], 256, cpu=True) == [
        ("gdn_1", "layerwise/gdn/1,256,cpu"),
        ("gdn_3", "layerwise/gdn/3,256,cpu"),
        ("gla_1", "layerwise/gla/1,256,cpu"),
        ("gla_3", "layerwise/gla/3,256,cpu"),
    ]
    with pytest.raises(ValueError, match="no FA layer"):
        grid_cells(get_config, ["gdn"], ["5"], 256, cpu=True)  # the tiny size has 4 layers
    with pytest.raises(ValueError, match="no FA layer"):
        grid_cells(get_config, ["gdn"], ["12"], 512)  # the small size has 12 layers
    with pytest.raises(ValueError, match="'gru'"):
        grid_cells(get_config, ["gru"], ["3"], 512)
    with pytest.raises(ValueError, match="both --mixers and --ratios"):
        grid_cells(get_config, ["gdn"], [], 512)


def test_a_groups_command_run_again_skips_its_finished_runs(tmp_path, capsys):
    """launch.experiment --seeds run again over a group: seeds whose training and closing
    evaluation finished are not run again (the tables come from them); a run cut during its
    evaluation, or one without its experiment.json, is not finished."""
    import shutil

    from hwh_jax.experiments.runner import finished, seeds

    src = Path(__file__).resolve().parents[2] / "measurements" / "experiment_L512_untaught_format"
    group = tmp_path / "untaught_hwh"
    shutil.copytree(src / "untaught_hwh", group)
    (group / "seeds.json").unlink()
    text = seeds(["--never-run"], [0, 1, 2], 3, group)  # a started process would fail
    out = capsys.readouterr().out
    assert all(f"seed {s}: finished already" in out for s in range(3)) and "started" not in out
    assert "over 3 seeds" in text and (group / "seeds.json").exists()
    results = group / "seed0" / "eval" / "results.json"
    res = json.loads(results.read_text())
    results.write_text(json.dumps({**res, "finished": False}))  # cut during its evaluation
    assert not finished(group / "seed0") and finished(group / "seed1")
    (group / "seed1" / "experiment.json").unlink()
    assert not finished(group / "seed1") and not finished(tmp_path / "absent")


def test_heldout_loss_scores_the_same_rows_whatever_the_micro_batch():
    """The held-out evaluation scores one fixed set of rows (a seeded sample spread over the
    stream, not its first book) whatever the micro-batch: the same tokens and, for the same
    weights, the same loss (the sums' order aside)."""
    import types

    from flax import nnx

    from hwh_jax.data.packing import PackedSequences
    from hwh_jax.data.pipeline import eval_batches, eval_order
    from hwh_jax.models import HybridLM, model_config
    from hwh_jax.training.loop import heldout_loss
    from hwh_jax.training.steps import make_eval_step

    stream = np.random.default_rng(0).integers(2, 300, 40 * 33 + 7).astype(np.int32)
    seqs = PackedSequences(stream, 32, eos_id=1, pad_id=0)  # 41 rows, the last one short
    rows = eval_order(len(seqs), 13)
    assert len(set(rows.tolist())) == 13 and rows.max() > 13  # a sample, not the first rows
    assert (eval_order(len(seqs), 13) == rows).all() and len(eval_order(len(seqs), 0)) == 41
    cfg = model_config("transformer", "tiny", dtype="float32", vocab_size=300)
    graphdef, params = nnx.split(HybridLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    eval_step = jax.jit(make_eval_step(graphdef))
    losses = {}
    for micro in (1, 3, 5, 13, 16):
        tokens = sum(
            float(b["loss_mask"].sum()) for b in eval_batches(seqs, batch=micro, sequences=13)
        )
        assert tokens == sum(float(seqs[int(i)]["loss_mask"].sum()) for i in rows)
        steps = types.SimpleNamespace(
            plan=types.SimpleNamespace(micro_batch=micro),
            eval_step=eval_step,
            batch_sharding=sharding,
        )
        losses[micro] = heldout_loss(seqs, steps, params, 13)
    assert max(losses.values()) - min(losses.values()) < 1e-5, losses


def test_a_progress_window_is_a_value_from_the_last():
    """``next_rate``: tokens/s and the data share over the steps since the last window, the
    last window itself where no step ended since (its rate stands)."""
    from hwh_jax.training.loop import Rate, next_rate

    first = Rate(t=100.0, step=10)
    got = next_rate(first, now=102.0, ended=14, waited=0.5, tokens_per_step=1000)
    assert got == Rate(102.0, 14, 2000.0, 2.0, 4, 0.25)
    assert next_rate(got, now=103.0, ended=14, waited=0.1, tokens_per_step=1000) is got
