"""A run whose data and workdir live in a Cloud Storage bucket, end to end, against a real GCS
server on loopback (fake-gcs-server, ``tests/object_store.py``): ``launch.prepare_data`` writes
token shards to the bucket, ``launch.train`` trains from them with ``--workdir=gs://...``, is
stopped by SIGTERM and resumes with the losses of an uninterrupted run, then ``launch.eval`` and
``launch.generate`` read the checkpoint from the bucket. A URL whose filesystem package is
missing is refused with one line and nothing written."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import XLA_TEST_FLAGS
from object_store import client_env, gcs_server

from hwh_jax import storage
from hwh_jax.data.paths import resolve
from hwh_jax.data.sources import read_text

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "gs://bkt"


@pytest.fixture(scope="module")
def server():
    with gcs_server("bkt") as url:
        yield url


@pytest.fixture(scope="module")
def env(server, tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env.update(
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(ROOT),
        XLA_FLAGS=XLA_TEST_FLAGS,
        HWH_CACHE_DIR=str(tmp_path_factory.mktemp("cache")),
        **client_env(server),
    )
    return env


def launch(env, module, *args, timeout=300):
    out = subprocess.run(
        [sys.executable, "-m", f"launch.{module}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


def train_args(workdir, *extra):
    # the Transformer: storage does not depend on the mixer, and it compiles fastest
    return [
        "--config=configs/base.py:transformer_tiny",
        f"--workdir={workdir}",
        "--config.seq_len=32",
        "--config.model.dtype=float32",
        "--config.data.source=shards",
        f"--config.data.paths=('{BUCKET}/data/shards',)",
        "--config.data.tokenizer=gpt2",
        "--config.data.heldout_fraction=0.05",
        "--config.train.steps=16",
        "--config.train.batch_size=8",
        "--config.train.warmup_steps=2",
        "--config.train.log_every=1",
        "--config.train.eval_every=0",
        "--config.train.checkpoint_every=8",
        "--config.train.eval_sequences=16",
        "--config.eval.at_end=False",
        *extra,
    ]


def losses(workdir) -> dict[int, float]:
    rows = [
        json.loads(r)
        for r in storage.path(f"{workdir}/metrics.jsonl").read_text().splitlines()
        if r.strip()
    ]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def test_a_bucket_run_prepares_trains_stops_resumes_and_is_read_back(env, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(read_text(resolve("tinyshakespeare/input.txt.gz"))[:60_000])
    out = launch(
        env,
        "prepare_data",
        f"--input={corpus}",
        "--tokenizer=gpt2",
        "--workers=1",
        f"--out={BUCKET}/data/shards",
    )
    assert "uploaded manifest.json" in out
    manifest = json.loads(storage.path(f"{BUCKET}/data/shards/manifest.json").read_text())
    assert manifest["complete"] and all(s["bytes"] > 0 for s in manifest["shards"])

    straight = f"{BUCKET}/runs/straight"
    launch(env, "train", *train_args(straight))
    want = losses(straight)
    assert sorted(want) == list(range(1, 17))

    # stopped by SIGTERM a few steps in, then the same command again
    cut = f"{BUCKET}/runs/cut"
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch.train", *train_args(cut)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("step      3/16"):
            proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, "".join(seen)[-3000:]
    stopped = [line for line in seen if line.startswith("stopped by SIGTERM at step")]
    assert stopped, "".join(seen)[-3000:]
    at = int(stopped[0].split()[5].rstrip(";"))
    assert 3 <= at < 16
    saved = sorted(
        int(p.name) for p in storage.path(f"{cut}/checkpoints").iterdir() if p.name.isdigit()
    )
    assert saved[-1] == at
    out = launch(env, "train", *train_args(cut))
    assert losses(cut) == want  # bitwise: the resume is exact
    log = storage.path(f"{cut}/train.log").read_text()
    assert f"resumed from step {at}" in log
    for name in ("config.json", "summary.json", "memory_plan.json"):
        assert storage.path(f"{cut}/{name}").exists(), name
    assert list(storage.path(f"{cut}/tensorboard").glob("events.out.tfevents.*"))
    assert not Path(ROOT / "gs:").exists()  # nothing went to a local "gs:" folder

    out = launch(
        env,
        "eval",
        f"--checkpoint={cut}",
        "--suite=ppl",
        "--ppl_factor=1",
        f"--out={BUCKET}/evals/cut",
    )
    results = json.loads(
        storage.path(f"{BUCKET}/evals/cut/0_transformer_cut/results.json").read_text()
    )
    assert results["step"] == 16 and results["finished"] and results["ppl"]
    assert storage.path(f"{BUCKET}/evals/cut/ppl_by_position.png").exists()
    out = launch(env, "generate", f"--checkpoint={cut}", "--prompt=ROMEO", "--max_new_tokens=4")
    assert "--- 'ROMEO'" in out


def test_a_url_without_its_package_is_refused_with_one_line(env, tmp_path):
    """gcsfs hidden from the process: exit 2, one line naming what to install, nothing
    written (no local 'gs:' folder, no log)."""
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoGcsfs:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'gcsfs' or name.startswith('gcsfs.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, _NoGcsfs())\n"
    )
    hidden = {**env, "PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.train",
            f"--config={ROOT / 'configs' / 'hwh_tiny.py'}",
            "--workdir=gs://bkt/runs/nowhere",
        ],
        cwd=tmp_path,
        env=hidden,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: gs://bkt/runs/nowhere: gs:// needs the gcsfs package")
    assert 'pip install "hwh-jax[gcs]"' in lines[-1]
    assert not any(line.startswith("Traceback") for line in lines)
    assert list(tmp_path.iterdir()) == [blocker]
    assert not storage.path(f"{BUCKET}/runs/nowhere").exists()
