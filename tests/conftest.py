"""Test setup: 8 fake CPU devices for mesh tests, absl flags marked parsed for grain."""
import atexit
import os
import shutil
import tempfile

# Tests compile many small programs: skipping LLVM's heavy optimisations halves compile time
# (results are bitwise the same here; only run speed drops, which tests do not measure).
XLA_TEST_FLAGS = "--xla_backend_optimization_level=0"
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {XLA_TEST_FLAGS}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache per pytest run, inherited by the launcher subprocesses:
# the trainer, eval and analysis programs that several tests compile are compiled once.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="hwh_jax_xla_cache_")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

from absl import flags  # noqa: E402

flags.FLAGS.mark_as_parsed()

# The longest test files first: pytest-xdist's --dist loadfile hands files to the workers in
# this order, so the long ones do not start last while the other worker idles.
LONG_FILES_FIRST = ("test_training.py", "test_multiprocess.py", "test_launch.py", "test_zoo.py",
                    "test_export.py", "test_inference.py", "test_bench.py", "test_shards.py",
                    "test_docs_commands.py", "test_memory.py", "test_model.py", "test_faults.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
