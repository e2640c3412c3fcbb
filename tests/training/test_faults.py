"""Faults injected into runs and inputs, each asserting what is kept, what is said and the exit
status (docs/training.md, "Faults"): a signal inside the save window, flipped bytes in a
checkpoint, a truncated one, a full disk, a non-finite loss, a workdir reused by another config,
bad config values, bad data, a broken Hugging Face config."""

import dataclasses
import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from configs import base
from hwh_jax.data.paths import resolve
from hwh_jax.data.sources import read_text
from hwh_jax.training import checkpoint as ckpt_lib
from hwh_jax.training.trainer import train_and_evaluate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    path = root / "shakespeare.txt"
    path.write_text(read_text(resolve("tinyshakespeare/input.txt.gz"))[:200_000])
    os.environ["HWH_CACHE_DIR"] = str(root / "cache")
    return path


def tiny(corpus, arch="transformer", **train):
    """The Transformer unless said: what a fault keeps and says does not depend on the mixer, and
    it compiles fastest."""
    config = base.get_config(f"{arch}_tiny")
    config.seq_len = 32
    config.model.dtype = "float32"
    config.model.la_chunk_size = 16
    config.data.paths = (str(corpus),)
    config.data.sp_vocab_size = 512
    config.data.heldout_fraction = 0.05
    t = config.train
    t.steps, t.batch_size, t.lr, t.warmup_steps = 6, 8, 3e-3, 2
    t.log_every, t.eval_every, t.checkpoint_every, t.eval_sequences = 1, 0, 2, 16
    t.mesh = (1, 1, 1)
    config.eval.at_end = False
    for k, v in train.items():
        setattr(t, k, v)
    return config


@pytest.fixture(scope="module")
def four_steps(corpus, tmp_path_factory):
    """A workdir of ``tiny`` trained 4 steps (checkpoints 2 and 4), trained once for the tests
    that damage a copy of it."""
    workdir = tmp_path_factory.mktemp("four_steps") / "w"
    train_and_evaluate(tiny(corpus, steps=4), workdir)
    return workdir


def _copy(workdir, to):
    import shutil

    shutil.copytree(workdir, to, dirs_exist_ok=True)
    return to


def saved_steps(workdir):
    return sorted(
        int(p.name) for p in (Path(workdir) / "checkpoints").iterdir() if p.name.isdigit()
    )


def test_signal_inside_the_save_window_ends_with_one_checkpoint(corpus, tmp_path, monkeypatch):
    """SIGTERM arriving while a periodic checkpoint is written: the save completes, the stop
    saves nothing twice, the run returns (status 0 in launch.train) and resumes exactly."""
    real_save = ckpt_lib.Checkpointer.save

    def save_with_signal(self, step, *args, **kw):
        os.kill(os.getpid(), signal.SIGTERM)  # delivered while the save runs
        return real_save(self, step, *args, **kw)

    monkeypatch.setattr(ckpt_lib.Checkpointer, "save", save_with_signal)
    first = train_and_evaluate(tiny(corpus), tmp_path)
    assert first.stopped_early and first.final_step == 2 and saved_steps(tmp_path) == [2]
    monkeypatch.setattr(ckpt_lib.Checkpointer, "save", real_save)
    straight = train_and_evaluate(tiny(corpus), tmp_path / "straight")
    second = train_and_evaluate(tiny(corpus), tmp_path)
    assert {**first.losses, **second.losses} == straight.losses  # bitwise
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in rows if r["split"] == "train"]
    assert train_steps == sorted(set(train_steps)) == list(range(1, 7))  # no step twice
    assert (
        json.loads((tmp_path / "summary.json").read_text())["wall_s"]
        > second.summary["wall_s"] - 1e-9
        > 0
    )


def test_sigterm_while_an_asynchronous_save_is_in_flight_ends_with_complete_checkpoints(
    corpus, tmp_path, monkeypatch
):
    """SIGTERM while the files of an asynchronous save are still being written (Orbax's
    finalisation held back until the signal has been seen): the stop waits for that save, saves
    its own step, the run returns normally (status 0 in launch.train) and a second start
    resumes with the losses of an uninterrupted run."""
    import threading
    import time

    import orbax.checkpoint as ocp

    real_finalize = ocp.CheckpointManager._finalize
    held = []

    def finalize_after_the_signal(self, step, *args, **kw):
        if not held:  # the first save only
            held.append(step)
            assert threading.current_thread() is not threading.main_thread()  # in flight
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)  # the loop reads the stop meanwhile
        return real_finalize(self, step, *args, **kw)

    monkeypatch.setattr(ocp.CheckpointManager, "_finalize", finalize_after_the_signal)
    first = train_and_evaluate(tiny(corpus, steps=8), tmp_path)
    assert held == [2] and first.signalled and first.stopped_early
    assert first.final_step >= 2 and saved_steps(tmp_path)[0] == 2
    assert saved_steps(tmp_path)[-1] == first.final_step
    monkeypatch.setattr(ocp.CheckpointManager, "_finalize", real_finalize)
    straight = train_and_evaluate(tiny(corpus, steps=8), tmp_path / "straight")
    second = train_and_evaluate(tiny(corpus, steps=8), tmp_path)
    assert {**first.losses, **second.losses} == straight.losses  # bitwise


def test_synchronous_saves_train_the_same_losses(corpus, tmp_path):
    """train.async_checkpoints=False (the old behaviour) against the default."""
    sync = train_and_evaluate(tiny(corpus, async_checkpoints=False), tmp_path / "sync")
    default = train_and_evaluate(tiny(corpus), tmp_path / "async")
    assert sync.losses == default.losses and saved_steps(tmp_path / "sync") == [2, 4, 6]
    assert saved_steps(tmp_path / "async") == [2, 4, 6]


def _flip(path: Path, count: int = 4096):
    data = bytearray(path.read_bytes())
    start = max(len(data) // 2 - count // 2, 0)
    for i in range(start, min(start + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_flipped_bytes_are_caught_and_the_previous_checkpoint_taken(
    corpus, four_steps, tmp_path, caplog
):
    _copy(four_steps, tmp_path)
    files = sorted(
        (p for p in (tmp_path / "checkpoints" / "4" / "state").rglob("*") if p.is_file()),
        key=lambda p: p.stat().st_size,
    )
    size = files[-1].stat().st_size
    _flip(files[-1])
    assert files[-1].stat().st_size == size
    res = train_and_evaluate(tiny(corpus, steps=5), tmp_path)
    assert sorted(res.losses) == [3, 4, 5] and all(np.isfinite(list(res.losses.values())))
    said = [r.getMessage() for r in caplog.records if "checkpoint of step 4" in r.getMessage()]
    assert len(said) == 1 and ("corrupt" in said[0] or "unreadable" in said[0]), said
    assert any(p.name.startswith("4.") for p in (tmp_path / "checkpoints").iterdir())


@pytest.mark.parametrize(
    "item,change",
    [
        (
            "data",
            lambda d: {
                **d,
                **{
                    k: v + 1 for k, v in d.items() if isinstance(v, int) and not isinstance(v, bool)
                },
            },
        ),
        ("meta", lambda m: {**m, "wall_s": m["wall_s"] + 1.0}),
    ],
)
def test_a_changed_data_position_or_metadata_sets_the_checkpoint_aside(
    corpus, four_steps, tmp_path, caplog, item, change
):
    """The data position (Grain's state) and the metadata are covered like the arrays: a
    checkpoint whose ``data`` or ``meta`` was edited is set aside as corrupt and the previous
    one taken, with one line; the run resumes exactly from there."""
    _copy(four_steps, tmp_path)
    file = tmp_path / "checkpoints" / "4" / item / "metadata"  # Orbax's JSON of the item
    saved = json.loads(file.read_text())
    changed = change(saved)
    assert changed != saved
    file.write_text(json.dumps(changed))
    res = train_and_evaluate(tiny(corpus, steps=5), tmp_path)
    assert sorted(res.losses) == [3, 4, 5]
    said = [r.getMessage() for r in caplog.records if "checkpoint of step 4" in r.getMessage()]
    what = "data position" if item == "data" else "metadata"
    assert len(said) == 1 and f"is corrupt (its {what} differs from what was saved)" in said[0]
    assert any(p.name.startswith("4.corrupt.") for p in (tmp_path / "checkpoints").iterdir())


def test_deleted_metadata_falls_back_with_one_line(corpus, four_steps, tmp_path, caplog):
    _copy(four_steps, tmp_path)
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "4" / "meta")
    res = train_and_evaluate(tiny(corpus, steps=5), tmp_path)
    assert sorted(res.losses) == [3, 4, 5]
    said = [r.getMessage() for r in caplog.records if "checkpoint of step 4" in r.getMessage()]
    assert len(said) == 1 and "unreadable" in said[0], said


@pytest.mark.parametrize("how", ["next_log_line", "compiler_killed"])
def test_a_signal_during_the_closing_evaluation_ends_cleanly(
    corpus, tmp_path, monkeypatch, capsys, how
):
    """SIGTERM while the final model is evaluated: the evaluation stops at its next log line,
    or, where the signal also killed a compiler the evaluation was running (a process group's
    SIGTERM reaches ptxas), at the error that follows; the run returns (status 0 in
    launch.train) with the last step's checkpoint complete."""
    from hwh_jax.training import trainer

    def evaluate(subject, spec, out_dir, log=print):
        os.kill(os.getpid(), signal.SIGTERM)
        if how == "compiler_killed":
            raise RuntimeError("INTERNAL: ptxas exited with non-zero error code 15")
        log("niah_single_1 @ 64: scoring")
        raise AssertionError("the evaluation went on after the signal")

    monkeypatch.setattr(trainer, "run_suite", evaluate)
    config = tiny(corpus, steps=3)
    config.eval.at_end, config.eval.suites = True, ("ppl",)
    res = train_and_evaluate(config, tmp_path)
    assert res.final_step == 3 and saved_steps(tmp_path) == [2, 3]
    cut = " (cut off: RuntimeError)" if how == "compiler_killed" else ""
    assert (
        f"stopped by SIGTERM during the evaluation{cut}; the checkpoint of step 3 is complete"
    ) in capsys.readouterr().out
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 3


def test_a_signal_during_the_closing_evaluation_keeps_what_was_measured(
    corpus, tmp_path, monkeypatch
):
    """SIGTERM in the second suite of the closing evaluation: results.json keeps the first
    suite's results, marked unfinished with what stopped it."""
    from hwh_jax.eval import suite

    def measure_then_signal(scorer, *, log, **kw):
        os.kill(os.getpid(), signal.SIGTERM)
        log("mqar: 1/3 settings")  # the trainer stops at the next line
        raise AssertionError("the evaluation went on after the signal")

    monkeypatch.setattr(suite.mqar, "evaluate_mqar", measure_then_signal)
    config = tiny(corpus, steps=2)
    config.eval.at_end = True
    config.eval.suites, config.eval.ppl_factor, config.eval.ppl_windows = ("ppl", "mqar"), 2, 2
    res = train_and_evaluate(config, tmp_path)
    assert res.final_step == 2
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["finished"] is False and "SIGTERM" in results["stopped"]
    assert results["ppl"] and "mqar" not in results


def test_fingerprint_sees_one_changed_bit_on_any_mesh():
    import jax.numpy as jnp

    state = {
        "w": jnp.arange(1000, dtype=jnp.float32).reshape(10, 100),
        "s": jnp.int32(3),
        "h": jnp.ones((7,), jnp.bfloat16),
    }
    a = ckpt_lib.fingerprint(state)
    flipped = np.asarray(state["w"]).copy()
    flipped.view(np.uint32)[3, 7] ^= 1 << 13
    b = ckpt_lib.fingerprint({**state, "w": jnp.asarray(flipped)})
    assert a["['w']"] != b["['w']"] and a["['s']"] == b["['s']"] and a["['h']"] == b["['h']"]
    swapped = np.asarray(state["w"]).copy()
    swapped[0, :2] = swapped[0, 1::-1]
    assert ckpt_lib.fingerprint({**state, "w": jnp.asarray(swapped)})["['w']"] != a["['w']"]


def test_generate_and_eval_fall_back_past_a_corrupt_checkpoint(four_steps, tmp_path, caplog):
    from hwh_jax.training.restore import load_run

    _copy(four_steps, tmp_path)
    for f in (tmp_path / "checkpoints" / "4" / "state").rglob("*"):
        if f.is_file() and f.stat().st_size > 1000:
            _flip(f)
    run = load_run(tmp_path)
    assert run.step == 2
    assert "checkpoint of step 4" in caplog.text
    with pytest.raises(ValueError, match="step 4 not in"):
        load_run(tmp_path, step=4)


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_why(
    corpus, tmp_path, monkeypatch, capsys
):
    import orbax.checkpoint as ocp

    real = ocp.CheckpointManager.save
    calls = []

    def full(self, step, *args, **kw):
        calls.append(step)
        if step == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, step, *args, **kw)

    monkeypatch.setattr(ocp.CheckpointManager, "save", full)
    with pytest.raises(
        ckpt_lib.CheckpointWriteError,
        match="No space left on device; the checkpoint of step 2 stays",
    ):
        train_and_evaluate(tiny(corpus, steps=4), tmp_path)
    assert saved_steps(tmp_path) == [2]
    from launch import one_line_errors

    with pytest.raises(SystemExit) as exit_info, one_line_errors():
        raise ckpt_lib.CheckpointWriteError("cannot write ...")
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.strip() == "error: cannot write ..."


def test_non_finite_marks_the_newest_checkpoint_suspect_and_the_next_start_skips_it(
    corpus, tmp_path, caplog
):
    config = tiny(
        corpus,
        steps=30,
        lr=1e12,
        clip_norm=0.0,
        warmup_steps=0,
        checkpoint_every=1,
        weight_decay=0.0,
    )
    with pytest.raises(FloatingPointError, match=r"at step (\d+) .*marked suspect") as e:
        train_and_evaluate(config, tmp_path)
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    nan_steps = [r["step"] for r in rows if r["split"] == "train" and not np.isfinite(r["loss"])]
    bad = int(e.value.args[0].split("at step ")[1].split()[0])
    assert nan_steps and nan_steps[0] == bad  # the metrics' step, 1-based
    marked = [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.endswith(".suspect")]
    assert marked == [f"{bad - 1}.suspect"]
    with pytest.raises(FloatingPointError):
        train_and_evaluate(config, tmp_path)
    assert f"skipping the checkpoint of step {bad - 1}: marked suspect" in caplog.text
    # a later run with a sane learning rate reaches the suspect step again and writes over it
    sane = tiny(corpus, steps=bad + 1, lr=1e-3, checkpoint_every=1)
    assert max(train_and_evaluate(sane, tmp_path).losses) == bad + 1
    assert bad - 1 in saved_steps(tmp_path)
    assert not (tmp_path / "checkpoints" / f"{bad - 1}.suspect").exists()
    assert f"the checkpoint of step {bad - 1} is replaced" in caplog.text


def test_a_dead_network_stops_before_it_is_saved_and_resumes_from_the_last_sane_step(
    corpus, tmp_path
):
    """A learning rate that kills the network after some sane steps (1e-3 for three steps,
    then 1e6): at the first step whose gradient vanished the run stops with one line; the
    checkpoint holding those weights (the step before) is marked suspect, so the next start,
    with a sane learning rate, resumes from the newest checkpoint before it and overwrites
    the suspect one."""
    from hwh_jax.training.trainer import Diverged

    sane = tiny(corpus, steps=3, lr=1e-3, checkpoint_every=1)
    train_and_evaluate(sane, tmp_path)
    dead = tiny(corpus, steps=8, lr=1e6, warmup_steps=0, checkpoint_every=1)
    with pytest.raises(
        Diverged,
        match=r"the gradient vanished at step 5 \(norm .*\): the "
        r"network is dead.*the checkpoint of step 4 holds those "
        r"weights and is marked suspect; the next start resumes "
        r"from step 3.*Lower train.lr \(now 1e\+06\)",
    ):
        train_and_evaluate(dead, tmp_path)
    assert (tmp_path / "checkpoints" / "4.suspect").exists()
    res = train_and_evaluate(tiny(corpus, steps=5, lr=1e-3, checkpoint_every=1), tmp_path)
    assert sorted(res.losses) == [4, 5] and all(np.isfinite(v) for v in res.losses.values())
    assert 4 in saved_steps(tmp_path) and not (tmp_path / "checkpoints" / "4.suspect").exists()


def test_a_workdir_refuses_another_model_or_data_config(corpus, four_steps, tmp_path):
    from hwh_jax.training.workdir import WorkdirMismatch

    _copy(four_steps, tmp_path)
    other = tiny(corpus, arch="hwh", steps=5)
    with pytest.raises(
        WorkdirMismatch,
        match=r"model.arch: 'transformer' -> 'hwh'.*"
        r"--config.train.accept_changes=.*model.arch",
    ):
        train_and_evaluate(other, tmp_path)
    longer = tiny(corpus, steps=5)
    longer.seq_len = 64
    with pytest.raises(WorkdirMismatch, match="seq_len: 32 -> 64"):
        train_and_evaluate(longer, tmp_path)
    assert saved_steps(tmp_path) == [2, 4]
    more = tiny(corpus, steps=5, lr=1e-3)  # steps and lr may change
    assert sorted(train_and_evaluate(more, tmp_path).losses) == [5]


def test_a_workdir_without_config_json_is_bound_by_its_checkpoints(corpus, four_steps, tmp_path):
    """A workdir made before config.json existed, reused by another architecture: refused by
    the newest checkpoint's own config, before anything is renamed or rewritten."""
    from hwh_jax.training.workdir import WorkdirMismatch

    _copy(four_steps, tmp_path)
    (tmp_path / "config.json").unlink()
    metrics = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(
        WorkdirMismatch,
        match=r"\(the checkpoint of step 4's metadata\): "
        r"model.arch: 'transformer' -> 'hwh'",
    ):
        train_and_evaluate(tiny(corpus, arch="hwh", steps=5), tmp_path)
    assert saved_steps(tmp_path) == [2, 4] and (tmp_path / "metrics.jsonl").read_text() == metrics
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if "." in p.name]
    assert sorted(train_and_evaluate(tiny(corpus, steps=5), tmp_path).losses) == [5]


def test_checkpoints_none_of_which_restores_refuse_a_fresh_start(corpus, four_steps, tmp_path):
    """Every checkpoint damaged: each is set aside with its line, then the start refuses (one
    line, the ways on) instead of training from step 0 over the run's metrics; so does the
    next start."""
    _copy(four_steps, tmp_path)
    metrics = (tmp_path / "metrics.jsonl").read_text()
    for step in (2, 4):
        for f in (tmp_path / "checkpoints" / str(step) / "state").rglob("*"):
            if f.is_file() and f.stat().st_size > 100:
                f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    for _ in range(2):
        with pytest.raises(
            ValueError,
            match=r"no checkpoint of .* can be restored \(set aside: "
            r"2\.unreadable\.\d+, 4\.unreadable\.\d+\): "
            r"starting over would replace",
        ):
            train_and_evaluate(tiny(corpus, steps=5), tmp_path)
    assert (tmp_path / "metrics.jsonl").read_text() == metrics


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("lr", float("nan"), "train.lr must be a finite number > 0, got nan"),
        ("lr", float("inf"), "train.lr must be a finite number > 0, got inf"),
        ("b1", 1.5, "train.b1 must be a finite number >= 0 and < 1, got 1.5"),
        ("stop_at_step", 9, "train.stop_at_step must be an integer >= 0 and <= 6, got 9"),
        ("mesh", ("a", "b"), "train.mesh must be three or four sizes"),
        ("clip_norm", -1.0, "train.clip_norm must be a finite number >= 0"),
        ("warmup_steps", -1, "train.warmup_steps"),
        ("z_loss", float("nan"), "train.z_loss"),
    ],
)
def test_config_values_are_checked_before_anything_compiles(corpus, tmp_path, key, value, match):
    config = tiny(corpus)
    setattr(config.train, key, value)
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
        train_and_evaluate(config, tmp_path)
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize(
    "content,match",
    [
        (b"", "holds no text"),
        (b"Too short.\n", "fewer than one sequence of seq_len"),
        (b"text\x00\x01\x02binary", r"bad.txt:1: not text \(a NUL byte"),
        (
            b"line one\nline two \xff\xfe here\n",
            r"bad.txt:2:10: invalid UTF-8 \(byte 0xff\).*"
            r"data.decode_errors='replace'",
        ),
    ],
    ids=["empty", "short", "binary", "utf8"],
)
def test_bad_text_is_named_with_file_line_and_the_key_to_change(tmp_path, content, match):
    from hwh_jax.data.pipeline import DataSpec, build_splits

    bad = tmp_path / "bad.txt"
    bad.write_bytes(content * (1 if content != b"Too short.\n" else 30))
    spec = DataSpec(
        paths=(str(bad),), tokenizer="gpt2", heldout_fraction=0.0, decode_errors="strict"
    )
    with pytest.raises(ValueError, match=match):
        build_splits(spec, 256)


def test_the_shipped_corpus_repair_is_debug_not_a_warning(caplog, monkeypatch):
    """The shipped Dickens corpus' 8 CP437 bytes are known (its PROVENANCE.txt): read as
    U+FFFD without a console warning on every first run."""
    import logging

    from hwh_jax.data import sources
    from hwh_jax.data.paths import ASSETS

    monkeypatch.setattr(sources, "_SAID", set())  # said once a process: not yet here
    with caplog.at_level(logging.DEBUG, logger=sources.__name__):
        text = "".join(sources.text_documents(ASSETS / "dickens" / "dickens.zip"))
    assert text.count("\ufffd") == 8
    said = [r for r in caplog.records if "read as U+FFFD" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.DEBUG]


def test_invalid_utf8_in_jsonl_stops_or_is_replaced_with_a_warning(tmp_path, caplog):
    from hwh_jax.data import sources

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "fine \xef\xbf\xbd"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2:\d+: invalid UTF-8"):
        list(sources.text_documents(bad, errors="strict"))
    assert list(sources.text_documents(bad))[1] == "caf\ufffd"  # the default: replace
    list(sources.text_documents(bad))  # read again (tokenizer, then shards)
    assert caplog.text.count("read as U+FFFD") == 1  # said once
    assert re.search(
        r"bad.jsonl: 1 invalid UTF-8 byte sequence\(s\) read as U\+FFFD, the "
        r"first at line 2, column \d+ \(data.decode_errors='strict'",
        caplog.text,
    )
    # a lenient run's cache does not stand in for a strict run's reading
    from hwh_jax.data.pipeline import DataSpec, _fingerprint

    lenient = DataSpec(paths=(str(bad),))
    strict = dataclasses.replace(lenient, decode_errors="strict")
    assert _fingerprint(lenient, lenient.paths) != _fingerprint(strict, strict.paths)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(ValueError, match=r"broken.jsonl:2: not a JSON object"):
        list(sources.text_documents(broken))


def test_a_vocabulary_too_large_for_the_corpus_names_the_key(tmp_path):
    from hwh_jax.data.tokenizers import train_sentencepiece

    docs = ["a small corpus of a few words, repeated."] * 20
    with pytest.raises(ValueError, match=r"data.sp_vocab_size=4096.*smaller"):
        train_sentencepiece(docs, 4096, tmp_path, key="tiny", where="data.paths ('x',)")


def test_hf_config_errors_name_the_file_and_key(tmp_path):
    from hwh_jax.hf.load import load_hf_checkpoint

    (tmp_path / "config.json").write_text('{"model_type": "qwen3",\n "hidden_size": }')
    with pytest.raises(ValueError, match=r"config.json:2:\d+: not valid JSON"):
        load_hf_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "qwen3", "hidden_size": 64}')
    with pytest.raises(KeyError, match=r"config.json: no 'num_attention_heads'"):
        load_hf_checkpoint(tmp_path)


def test_generate_places_the_space_after_the_prompt(tmp_path):
    from hwh_jax.data.tokenizers import SentencePieceTokenizer, train_sentencepiece
    from launch.generate import continuation

    text = read_text(resolve("tinyshakespeare/input.txt.gz"))[:200_000].split("\n\n")
    tok = SentencePieceTokenizer(
        train_sentencepiece(text, 512, tmp_path, key="gen"), use_seqio=False
    )
    prompt, rest = tok.encode("It was"), tok.encode("It was the best")[len(tok.encode("It was")) :]
    assert continuation(tok, prompt, rest) == " the best"


def test_a_truncated_checkpoint_costs_one_line_and_status_0(corpus, four_steps, tmp_path):
    """launch.train over a workdir whose newest checkpoint is truncated: one line says so, the
    previous one is taken, the library's tracebacks go to train.log, not the console."""
    args = [
        sys.executable,
        "-m",
        "launch.train",
        "--config=configs/base.py:transformer_tiny",
        f"--workdir={tmp_path}",
        "--config.seq_len=32",
        "--config.model.dtype=float32",
        "--config.model.la_chunk_size=16",
        f"--config.data.paths=('{corpus}',)",
        "--config.data.sp_vocab_size=512",
        "--config.data.heldout_fraction=0.05",
        "--config.train.batch_size=8",
        "--config.train.warmup_steps=2",
        "--config.train.log_every=1",
        "--config.train.eval_every=0",
        "--config.train.checkpoint_every=2",
        "--config.train.mesh=1,1,1",
        "--config.eval.at_end=False",
        "--config.train.final_eval=False",
    ]
    from conftest import XLA_TEST_FLAGS

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": XLA_TEST_FLAGS}
    _copy(four_steps, tmp_path)  # the run of 4 steps, as the same command makes it
    (tmp_path / "train.log").unlink(missing_ok=True)
    for f in (tmp_path / "checkpoints" / "4" / "state").rglob("*"):
        if f.is_file() and f.stat().st_size > 100:
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    second = subprocess.run(
        args + ["--config.train.steps=5"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    console = second.stdout + second.stderr
    assert "resumed from step 2" in console
    mentions = [line for line in console.splitlines() if "checkpoint of step 4" in line]
    assert len(mentions) == 1, mentions
    assert "Traceback" not in console and len(console.splitlines()) < 60, console[-3000:]
    assert "Traceback" in (tmp_path / "train.log").read_text()


@pytest.mark.parametrize(
    "args,said",
    [
        (
            ["--config=configs/hwh_tiny.py", "--config.train.stpes=3"],
            'error: a --config override names no key of the config: stpes Did you mean "steps"',
        ),
        (
            ["--config=configs/nope.py"],
            "error: --config: [Errno 2] No such file or directory: 'configs/nope.py'",
        ),
        (  # a value refused by the run's checks: no workdir made, no log file written
            ["--config=configs/hwh_tiny.py", "--config.train.lr=-1"],
            "error: train.lr must be a finite number > 0, got -1.0",
        ),
    ],
)
def test_a_config_error_in_the_flags_is_one_line_status_2_and_writes_nothing(tmp_path, args, said):
    workdir = tmp_path / "w"
    out = subprocess.run(
        [sys.executable, "-m", "launch.train", *args, f"--workdir={workdir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith(said), lines
    assert not workdir.exists()


def test_a_second_trainer_on_a_busy_workdir_refuses_and_the_first_is_untouched(corpus, tmp_path):
    """The same command twice on one workdir: the second refuses within seconds (one line
    naming the holder, status 2); the first trains on, stops on SIGTERM with its checkpoint
    and leaves every step once in metrics.jsonl and no lease behind."""
    from conftest import XLA_TEST_FLAGS

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": XLA_TEST_FLAGS}
    args = [
        sys.executable,
        "-m",
        "launch.train",
        "--config=configs/base.py:transformer_tiny",
        f"--workdir={tmp_path}",
        "--config.seq_len=32",
        "--config.model.dtype=float32",
        f"--config.data.paths=('{corpus}',)",
        "--config.data.sp_vocab_size=512",
        "--config.data.heldout_fraction=0.05",
        "--config.train.batch_size=8",
        "--config.train.steps=100000",
        "--config.train.log_every=1",
        "--config.train.eval_every=0",
        "--config.train.checkpoint_every=0",
        "--config.train.mesh=1,1,1",
        "--config.eval.at_end=False",
        "--config.train.final_eval=False",
    ]
    first = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        import time

        deadline = time.time() + 300
        metrics = tmp_path / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            assert first.poll() is None and time.time() < deadline, first.communicate()[1][-2000:]
            time.sleep(0.5)
        t = time.time()
        second = subprocess.run(
            args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert time.time() - t < 60
        assert second.returncode == 2, second.stderr[-2000:]
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "is in use by another run" in lines[0], lines
        assert f"pid {first.pid}" in lines[0]
        assert first.poll() is None  # the first one trains on
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    steps = [
        json.loads(line)["step"]
        for line in metrics.read_text().splitlines()
        if json.loads(line)["split"] == "train"
    ]
    assert steps == sorted(set(steps)) and steps[0] == 1
    assert saved_steps(tmp_path) == [steps[-1]]
    assert not (tmp_path / "lease.json").exists()


def test_an_unreachable_bucket_is_one_line_and_status_2_within_seconds():
    """A gs:// workdir whose storage service takes no connection (the emulator's address set
    to a closed loopback port): one line naming the address, status 2, long before the
    store's client would have given up (over a minute, a traceback a retry)."""
    import socket

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.time()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.train",
            "--config=configs/hwh_tiny.py",
            "--workdir=gs://hwh-unreachable/run",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}",
        },
    )
    assert time.time() - started < 30
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"127.0.0.1:{port} cannot be reached" in lines[0], lines


def test_an_unwritable_workdir_is_one_line_and_status_2(tmp_path):
    """A workdir where nothing can be created (sysfs: EPERM for root, EACCES for others)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.train",
            "--config=configs/hwh_tiny.py",
            "--workdir=/sys/hwh_jax_test_workdir",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot be written" in lines[0], lines


def test_an_evaluation_the_run_cannot_hold_is_refused_before_training(corpus, tmp_path):
    """eval.at_end with NIAH at a length too short for its template: refused after the data is
    read (the tokenizer decides), before the first step, naming the keys; nothing bound."""
    fresh = tmp_path / "fresh.txt"  # a corpus no other test has tokenised
    fresh.write_text(corpus.read_text()[:60_000])
    config = tiny(fresh, steps=2)
    config.eval.at_end, config.eval.suites, config.eval.niah_factors = True, ("niah",), (1,)
    shards = Path(os.environ["HWH_CACHE_DIR"]) / "shards"
    before = sorted(shards.iterdir()) if shards.exists() else []
    with pytest.raises(
        ValueError,
        match=r"eval: niah_single_1: length 32 leaves no room.*"
        r"raise seq_len or eval.niah_factors \(\[1\] x 32\)",
    ):
        train_and_evaluate(config, tmp_path / "w")
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == []
    assert (sorted(shards.iterdir()) if shards.exists() else []) == before  # not tokenised


def test_a_file_size_limit_is_one_line_status_1_without_library_noise(corpus, tmp_path):
    """A checkpoint write refused by the OS (``ulimit -f``: EFBIG; a full disk, ENOSPC, takes
    the same path, TensorStore naming the OS error only in its message): one line saying what
    failed and what stays, status 1, none of the hundreds of 'Event loop is closed'
    tracebacks TensorStore's late callbacks print."""
    from conftest import XLA_TEST_FLAGS

    limited = (
        "import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, "
        "(1 << 20, 1 << 20)); os.execv(sys.executable, [sys.executable] + sys.argv[1:])"
    )
    args = [
        sys.executable,
        "-c",
        limited,
        "-m",
        "launch.train",
        "--config=configs/base.py:transformer_tiny",
        f"--workdir={tmp_path / 'w'}",
        "--config.seq_len=32",
        "--config.model.dtype=float32",
        f"--config.data.paths=('{corpus}',)",
        "--config.data.sp_vocab_size=512",
        "--config.data.heldout_fraction=0.05",
        "--config.train.batch_size=8",
        "--config.train.steps=4",
        "--config.train.checkpoint_every=2",
        "--config.train.eval_every=0",
        "--config.train.mesh=1,1,1",
        "--config.eval.at_end=False",
        "--config.train.final_eval=False",
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": XLA_TEST_FLAGS}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # its files may exceed the limit
    out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: cannot write the checkpoint of step 2 to "
        f"{tmp_path / 'w' / 'checkpoints'}: File too large; no earlier checkpoint "
        "exists"
    ], out.stderr[-3000:]
    assert "Event loop is closed" not in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("flag", ["--help", "--helpfull"])
def test_help_exits_0(flag):
    out = subprocess.run(
        [sys.executable, "-m", "launch.train", flag],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0 and "--workdir" in out.stdout + out.stderr


def test_a_warmup_longer_than_the_run_is_named(caplog):
    import logging

    from hwh_jax.training.optimizer import OptimizerSpec

    with caplog.at_level(logging.WARNING):
        OptimizerSpec(lr=1e-3, warmup_steps=100, total_steps=6).validate()
        OptimizerSpec(lr=1e-3, warmup_steps=100, total_steps=6).validate()  # said once
    assert caplog.text.count("train.warmup_steps=100 is not below train.steps=6") == 1
    assert "never reaches train.lr=0.001 (the last step's is 5e-05)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        OptimizerSpec(lr=1e-3, warmup_steps=2, total_steps=6).validate()
    assert "warmup" not in caplog.text


def test_a_refused_start_does_not_bind_its_workdir(corpus, tmp_path):
    """A start refused while its data is read (token shards without data.tokenizer) leaves no
    config.json, so the corrected command is not taken for another run."""
    from hwh_jax.data import shards
    from hwh_jax.data.paths import resolve
    from hwh_jax.data.tokenizers import GPT2BPE

    prepared = shards.prepare(
        [read_text(corpus)[:20_000]],
        GPT2BPE(resolve("gpt2_bpe")),
        tmp_path / "shards",
        source={"test": 1},
        echo=lambda s: None,
    )
    config = tiny(corpus, steps=1)
    config.data.source, config.data.paths = "shards", (str(prepared),)
    with pytest.raises(ValueError, match="needs data.tokenizer 'gpt2' or 'sentencepiece'"):
        train_and_evaluate(config, tmp_path / "w")
    assert not (tmp_path / "w" / "config.json").exists()
    config.data.tokenizer = "gpt2"
    assert sorted(train_and_evaluate(config, tmp_path / "w").losses) == [1]


def test_the_log_file_keeps_info_and_tracebacks_not_debug_chatter(tmp_path):
    """train.log: INFO and above, and the project's tracebacks of handled failures (DEBUG
    records with exc_info), but no DEBUG chatter (Orbax's and asyncio's were most of a tiny
    run's 3 MB) unless --verbosity=1."""
    import logging

    from launch import setup_logging

    root = logging.getLogger()
    before = list(root.handlers)
    try:
        setup_logging(tmp_path / "train.log")
        logging.getLogger("hwh_jax.training.trainer").debug("ours in detail")
        try:
            raise OSError("disk full")
        except OSError:
            logging.getLogger("hwh_jax.training.checkpoint").debug("writing failed", exc_info=True)
        logging.getLogger("orbax.checkpoint").debug("library chatter")
        logging.getLogger("orbax.checkpoint").warning("library warning")
        for h in root.handlers:
            h.flush()
    finally:
        for h in root.handlers[len(before) :]:
            root.removeHandler(h)
    text = (tmp_path / "train.log").read_text()
    assert "library warning" in text and "writing failed" in text and "disk full" in text
    assert "library chatter" not in text and "ours in detail" not in text
