"""Test setup: 8 fake CPU devices for mesh tests, absl flags marked parsed for grain.

The suite runs on the CPU backend unless JAX_PLATFORMS is set: the kernel tests that compile for
a GPU run on one with ``JAX_PLATFORMS=cuda`` (``bash bench/tables.sh OUT compiled``) and are
skipped or interpreted otherwise."""

import atexit
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Tests compile many small programs: skipping LLVM's heavy optimisations halves compile time
# (results are bitwise the same here; only run speed drops, which tests do not measure), and
# XLA:CPU's older elemental emitters instead of its MLIR fusion emitters compile a training step
# in about half the time again (the whole suite ~40% faster on 2 cores). An XLA that does not
# know a flag aborts, so the second is tried once in a subprocess (the workers inherit the result).
FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def _accepted(flags: tuple) -> str:
    """``flags`` this jaxlib's XLA accepts: the first always, the rest if a process starts with
    them."""
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; jax.devices()"],
        env={**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        timeout=120,
    )
    return " ".join(flags if probe.returncode == 0 else flags[:1])


if "HWH_XLA_TEST_FLAGS" not in os.environ:
    os.environ["HWH_XLA_TEST_FLAGS"] = _accepted(FAST_COMPILE)
XLA_TEST_FLAGS = os.environ["HWH_XLA_TEST_FLAGS"]
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {XLA_TEST_FLAGS}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache per pytest run, inherited by the launcher subprocesses:
# the trainer, eval and analysis programs that several tests compile are compiled once.
# Programs are cached whatever their compile time (the default keeps only those over a second):
# the launcher subprocesses each compile dozens of small ones (init, evaluation, the data's).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="hwh_jax_xla_cache_")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Runs that several test files read (never write), made once per pytest run for every worker.
if "HWH_TEST_SHARED_RUNS" not in os.environ:
    os.environ["HWH_TEST_SHARED_RUNS"] = tempfile.mkdtemp(prefix="hwh_jax_test_runs_")
    atexit.register(shutil.rmtree, os.environ["HWH_TEST_SHARED_RUNS"], ignore_errors=True)

# PyTorch (installed for the Hugging Face parity tests, CPU build) imports the `triton` package
# when it is present, only to learn which GPU compilers it has. Loading Triton's native library
# into a test worker that already holds JAX, W&B and thread pools once aborted the worker (and
# pytest-xdist then waited for it forever); nothing on the CPU needs that package (JAX's Pallas
# lowers to Triton through its own jaxlib), so the tests keep it out: `import triton` fails.
sys.modules.setdefault("triton", None)

from absl import flags  # noqa: E402 - after the environment above

flags.FLAGS.mark_as_parsed()

# The longest test files first: pytest-xdist's --dist loadfile hands files to the workers in
# this order, so the long ones do not start last while the other worker idles.
LONG_FILES_FIRST = (
    "test_training.py",
    "test_multiprocess.py",
    "test_launch.py",
    "test_zoo.py",
    "test_export.py",
    "test_inference.py",
    "test_bench.py",
    "test_shards.py",
    "test_docs_commands.py",
    "test_memory.py",
    "test_model.py",
    "test_faults.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def train_main_job(workdir) -> None:
    """The main job's config (configs/hwh_tiny.py) trained 4 steps of 4 x 64 tokens into
    ``workdir`` by ``launch.train`` (a run for the tests of what follows training: export,
    evaluation launchers)."""
    argv = [
        "launch.train",
        "--config=configs/hwh_tiny.py",
        f"--workdir={workdir}",
        "--config.seq_len=64",
        "--config.train.steps=4",
        "--config.train.batch_size=4",
        "--config.train.warmup_steps=1",
        "--config.train.eval_every=0",
        "--config.train.mesh=1,1,1",
        "--config.eval.at_end=False",
    ]
    done = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def main_job_run() -> Path:
    """``train_main_job``'s run, trained once per pytest run and shared by its workers (a lock
    file orders them); for tests that only read it (export, the lm-eval harness)."""
    root = Path(os.environ["HWH_TEST_SHARED_RUNS"])
    work = root / "main_job"
    with open(root / "main_job.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (root / "main_job.done").exists():
            shutil.rmtree(work, ignore_errors=True)  # a worker that failed half-way
            train_main_job(work)
            (root / "main_job.done").touch()
    return work
