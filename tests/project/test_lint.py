"""ruff's lint and format checks (pyproject.toml, [tool.ruff]: the rules and why) over the
project's code, as part of the test command, so CI runs them."""

import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ruff(*args):
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_lint_passes():
    done = _ruff("check", "--output-format", "concise", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_ruff_format_leaves_the_code_as_it_is():
    done = _ruff("format", "--check", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_every_noqa_says_why():
    """A ``noqa`` comment names its codes and then its reason (`` - why`` or ``(why)``)."""
    bare = []
    for path in ROOT.glob("**/*.py"):
        if {".venv", "assets", "build"} & set(path.relative_to(ROOT).parts):
            continue
        with open(path, "rb") as f:
            for tok in tokenize.tokenize(f.readline):
                if (
                    tok.type == tokenize.COMMENT
                    and "noqa" in tok.string
                    and not REASONED.search(tok.string)
                ):
                    bare.append(f"{path.relative_to(ROOT)}:{tok.start[0]}")
    assert not bare, bare


REASONED = re.compile(r"noqa: [A-Z]+\d+(, ?[A-Z]+\d+)* *(- |\()\S")
