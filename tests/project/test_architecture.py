"""The code's shape: imports point down the layers of pyproject.toml (import-linter), the picture
in docs/architecture.md is the code's, every public class says what it is, docstrings carry no
timings, and importing the project changes no global setting."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hwh_jax", "kernels_pallas", "launch", "configs")


def _sources():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_imports_point_down_the_layers():
    """import-linter's contracts (pyproject.toml) hold; a violation prints the import chain.
    Its CLI configures logging with ``dictConfig``, which disables every logger that exists
    already: they are enabled again after, or later tests in this process see no records."""
    import logging

    from importlinter.cli import lint_imports

    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]
    was = [logger.disabled for logger in loggers]
    try:
        assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0
    finally:
        for logger, disabled in zip(loggers, was):
            logger.disabled = disabled


PATHLIB_CALL = re.compile(r"(?<![\w.])(pathlib\.)?Path\(")


def test_run_and_data_locations_go_through_storage():
    """A location a user may give as a bucket URL (workdir, data, checkpoint, output folder) is
    built with ``hwh_jax.storage.path``: ``pathlib.Path("gs://b/x")`` is the local folder
    ``gs:/b/x``. A ``Path(...)`` call elsewhere in hwh_jax/ and launch/ says on its line why
    its location is local (``# local path: ...``)."""
    found = []
    for package in ("hwh_jax", "launch"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "storage.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if PATHLIB_CALL.search(code) and "# local path" not in line:
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


PRIVATE_JAX = re.compile(r"(from|import)\s+jax\._src\b|jax\._src\.")


def test_private_jax_is_used_in_compat_only():
    """``jax._src`` is imported in ``kernels_pallas/compat.py`` alone (the packages, bench/ and
    tools/), so a JAX upgrade that moves a private module breaks one file; each of its entries
    answers on this JAX."""
    from kernels_pallas import compat

    files = [*_sources(), *sorted((ROOT / "bench").rglob("*.py")), *(ROOT / "tools").rglob("*.py")]
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in files
        if path != ROOT / "kernels_pallas" / "compat.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE_JAX.search(line.split("#", 1)[0])
    ]
    assert not found, found
    assert compat.cudnn_attention() is not None and compat.triton_lowering() is not None
    assert len(compat.jaxlib_version()) == 3


def test_the_architecture_picture_is_the_codes():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "architecture.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr


def test_every_public_class_has_a_docstring():
    missing = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
        for path in _sources()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and not node.name.startswith("_")
        and not ast.get_docstring(node)
    ]
    assert not missing, missing


TIMING = re.compile(
    r"\b\d[\d,.]*\s?(ms|us|µs|TB/s|GB/s|TFLOP/s|tokens/s|tok/s)\b"  # a time or a rate
    r"|\b\d+(\.\d+)?(-\d+(\.\d+)?)?x\b(?=[^.;:]{0,40}\b(faster|slower|time|speed|throughput))"
    r"|\b\d+(\.\d+)?(-\d+(\.\d+)?)?\s?%\s(faster|slower|of the time)",  # a ratio of times
    re.IGNORECASE,
)


def _quoted_timings(paths) -> list[str]:
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                hit = TIMING.search(ast.get_docstring(node) or "")
                if hit:
                    found.append(f"{path.name}: {hit.group(0)!r}")
    return found


def test_no_docstring_quotes_a_timing():
    """Timings and ratios of timings live in docs/benchmarks.md with their date, device and
    command (they go stale in a docstring)."""
    assert not _quoted_timings(_sources())


@pytest.mark.parametrize(
    "planted,caught",
    [
        ("the kernel takes 0.71-0.75x the Triton kernel's time", True),
        ("2-3x faster than the scan", True),
        ("12% faster than XLA", True),
        ("at 4.8 TB/s", True),
        ("3.2 ms a step", True),
        ("windows of 4x the training length", False),
        ("a 2x2x4 slice", False),
        ("100 x share of strings found", False),
        ("the 2 x G x D bytes of a slot", False),
    ],
)
def test_the_timing_guard_catches_a_planted_ratio(tmp_path, planted, caught):
    module = tmp_path / "planted.py"
    module.write_text(f'"""A module."""\n\n\ndef f():\n    """{planted}."""\n')
    assert bool(_quoted_timings([module])) == caught


@pytest.mark.parametrize(
    "module", ["hwh_jax", "hwh_jax.models", "hwh_jax.training.trainer", "launch.train"]
)
def test_importing_changes_no_global_setting(module):
    """Importing the project leaves Flax's and JAX's configuration as it found it."""
    code = (
        "import flax, jax; before = (flax.config.flax_always_shard_variable, "
        "jax.config.jax_threefry_gpu_kernel_lowering); "
        f"import {module}; "
        "after = (flax.config.flax_always_shard_variable, "
        "jax.config.jax_threefry_gpu_kernel_lowering); "
        "assert before == after, (before, after)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_docs_stay_a_reference():
    """docs/ is a reference, not a store of runs: under 2 MB in git (the rows behind its tables
    live in measurements/), and docs/benchmarks.md the current figures in at most 400 lines."""
    import subprocess

    files = subprocess.run(
        ["git", "ls-files", "docs"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert files, "git ls-files docs found nothing: run the tests from a clone"
    size = sum((ROOT / f).stat().st_size for f in files if (ROOT / f).exists())
    assert size < 2_000_000, f"docs/ holds {size:,} bytes"
    lines = len((ROOT / "docs" / "benchmarks.md").read_text().splitlines())
    assert lines <= 400, f"docs/benchmarks.md has {lines} lines"
