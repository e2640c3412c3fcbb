"""One end-to-end run of each launcher as a user would type it (launch.train: test_training)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args, env=None):
    out = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_describe_prints_counts_allocation_and_forward():
    out = run("launch.describe", "--config=configs/hwh_tiny.py", "--forward")
    assert "params: total 1,344,116" in out
    assert "FA share 0.1875" in out and "NoPE" in out
    assert "loss at init" in out


def test_describe_overrides_and_table():
    out = run(
        "launch.describe",
        "--config=configs/base.py:hwh_380m",
        "--config.model.counts=0,1,2,3,4,5,5,5,5,5,5,5,5,5,5,5,5,4,3,2,1,0,0,0",
    )
    assert "FA share 0.2083 (80 FA / 304 LA heads, linear heads gdn)" in out
    # a linear-head kind from a module outside the package (tests/toy_kind.py) is listed
    path = os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "HWH_HEAD_KINDS": "toy_kind", "PYTHONPATH": path}
    table = run("launch.describe", "--table", env=env)
    assert table.count("\n") > 30 and "| 1b4 | hwh |" in table
    assert "| small | hwh | toy_ema |" in table and "| 1b4 | gdn | toy_ema |" in table


def test_train_then_evaluate_and_generate_end_to_end(tmp_path):
    """A tiny experiment (training + its closing evaluation + experiment.json); launch.eval then
    runs every suite on the checkpoint; the report tabulates it and a folder of two seed runs
    (copies of it: each run and a row over the seeds; cross-model figures); launch.analyze
    launch.trace_retrieval follows its FA heads over its two checkpoints. The Transformer: the
    launchers do not depend on the mixer, and it compiles fastest (HwH's decoding, scoring and
    training: tests/inference/test_inference.py, test_eval.py, test_training.py; launch.generate and
    launch.analyze on a trained run: tests/training/test_multiprocess.py; generate also test_faults.py,
    analyze also test_analysis.py.)"""
    import json
    import shutil

    from hwh_jax.data.paths import resolve
    from hwh_jax.data.sources import read_text

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(read_text(resolve("tinyshakespeare/input.txt.gz"))[:150_000])
    work = tmp_path / "run"
    out = run(
        "launch.experiment",
        "--config=configs/base.py:transformer_tiny",
        f"--out={work}",
        "--config.seq_len=64",
        "--config.model.la_chunk_size=16",
        f"--config.data.paths=('{corpus}',)",
        "--config.data.sp_vocab_size=512",
        "--config.data.heldout_fraction=0.1",
        "--config.train.steps=4",
        "--config.train.batch_size=4",
        "--config.train.warmup_steps=1",
        "--config.train.eval_every=0",
        "--config.train.log_every=2",
        "--config.train.checkpoint_every=2",
        "--config.train.mesh=1,1,1",
        "--config.eval.niah_factors=(8,)",
        "--config.eval.niah_depths=2",
        "--config.eval.niah_tasks=('niah_single_1','niah_single_3')",
    )
    assert "NIAH (mean score" in out and "niah_single_1@512 " in out
    assert "experiment run (transformer" in out
    exp = json.loads((work / "experiment.json").read_text())
    assert exp["tokens"] == 4 * 4 * 64 and exp["tokens_per_s"] > 0
    assert set(exp["niah"]) == {"niah_single_1@512", "niah_single_3@512"}
    summary = json.loads((work / "summary.json").read_text())
    assert set(summary["eval"]["niah_summary"]) == {"niah_single_1@512", "niah_single_3@512"}
    assert (work / "eval" / "niah_niah_single_3.png").exists()
    assert (work / "eval" / "ppl_by_position.png").exists()

    ev = tmp_path / "ev"
    out = run(
        "launch.eval",
        f"--checkpoint={work}",
        f"--out={ev}",
        "--suite=niah,mqar,ppl,longppl,commonsense",
        "--niah_factors=8",
        "--niah_depths=1",
        "--longppl_factor=2",
        f"--longppl_evaluator={work}",
        "--niah_samples=2",
        "--niah_tasks=niah_single_2",
        "--ppl_factor=2",
        "--commonsense_limit=3",
        "--commonsense_tasks=piqa,lambada_openai",
        "--mqar_examples=4",
        "--batch_size=4",
    )
    assert "lambada_openai: acc" in out and "mqar seq 256 pairs 16" in out
    res = json.loads((ev / "0_transformer_run" / "results.json").read_text())
    assert {r["depth"] for r in res["niah"]} == {0} and len(res["ppl"]) == 8
    assert res["longppl"]["evaluator"] == "transformer@run" and res["longppl"]["length"] == 128
    assert set(res["commonsense"]) == {"piqa", "lambada_openai"}  # every task's loader and
    # scoring: tests/eval/test_eval.py
    assert all(0 <= v["acc"] <= 1 and v["examples"] == 3 for v in res["commonsense"].values())
    assert (ev / "niah_extrapolation.png").exists() and (ev / "ppl_by_position.png").exists()
    # without --out: a folder of its own, the closing evaluation's eval/ untouched
    closing = {p.name: p.read_bytes() for p in (work / "eval").iterdir() if p.is_file()}
    run("launch.eval", f"--checkpoint={work}", "--suite=ppl", "--ppl_factor=2")
    assert (work / "evals" / "ppl_step4" / "0_transformer_run" / "results.json").exists()
    assert {p.name: p.read_bytes() for p in (work / "eval").iterdir() if p.is_file()} == closing

    seeds = tmp_path / "seeds"
    for s in (0, 1):
        shutil.copytree(work, seeds / f"seed{s}")
    out = run("launch.experiment", f"--report={work},{seeds}", f"--out={tmp_path / 'rep'}")
    assert "| run | transformer |" in out and "| seeds/seed1 | transformer |" in out
    assert "S-NIAH-3@512" in out and "parameter spread 0.0%" in out and "Over seeds" in out
    assert "| seeds | transformer | 2 |" in out
    over = json.loads((tmp_path / "rep" / "seeds.json").read_text())[0]
    cell = over["niah"]["niah_single_1@512"]
    assert over["seeds"] == 2 and cell["std"] == 0.0 and len(cell["values"]) == 2
    assert cell["pooled"]["n"] == 2 * exp["niah_intervals"]["niah_single_1@512"]["n"]
    whole = over["niah_by_length"]["512"]  # both tasks of the length, both seeds
    assert whole["pooled"]["n"] == 2 * sum(iv["n"] for iv in exp["niah_intervals"].values())
    assert whole["std"] == 0.0 and "| seeds | transformer | 2 | " in out and "NIAH@512" in out
    assert (tmp_path / "rep" / "niah_extrapolation.png").exists()

    out = run(
        "launch.trace_retrieval",
        f"--checkpoint={work}",
        "--qr_samples=2",
        "--seq_len=256",
        "--threshold=0.01",
        f"--out={tmp_path / 'trace'}",
    )
    trace = json.loads((tmp_path / "trace" / "trace.json").read_text())
    heads = trace["heads"]  # every head of the Transformer is FA
    assert trace["steps"] == [2, 4] and heads and all(len(h["scores"]) == 2 for h in heads)
    assert all(h["first_step"] in (None, 2, 4) for h in heads)
    assert "FA heads reach QRscore 0.01" in out and (tmp_path / "trace" / "trace.png").exists()


def test_seeds_run_side_by_side_and_a_failed_seed_is_named(tmp_path):
    """--seeds starts one process per seed, --side_by_side at once, each with its console log;
    seeds whose run fails (here: a bad config value) are named, and the status is 1."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.experiment",
            "--config=configs/hwh_tiny.py",
            "--seeds=0,1",
            "--side_by_side=2",
            f"--out={tmp_path}",
            "--config.train.steps=0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stderr[-2000:]
    assert "seed 0: started (console:" in out.stdout and "seed 1: exit 2" in out.stdout
    assert (
        "error: seed 0, seed 1 did not finish" in out.stderr
        or "error: seed 1, seed 0 did not finish" in out.stderr
    ), out.stderr[-2000:]
    for s in (0, 1):
        assert "train.steps" in (tmp_path / f"seed{s}.console.log").read_text()
