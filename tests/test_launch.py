"""One end-to-end run of each launcher as a user would type it (launch.train: test_training)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    out = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_describe_prints_counts_allocation_and_forward():
    out = run("launch.describe", "--config=configs/hwh_tiny.py", "--forward")
    assert "params: total 1,344,116" in out
    assert "FA share 0.1875" in out and "NoPE" in out
    assert "loss at init" in out


def test_describe_overrides_and_table():
    out = run("launch.describe", "--config=configs/hwh_380m.py",
              "--config.model.counts=0,1,2,3,4,5,5,5,5,5,5,5,5,5,5,5,5,4,3,2,1,0,0,0")
    assert "FA share 0.2083 (80 FA / 304 LA heads)" in out
    table = run("launch.describe", "--table")
    assert table.count("\n") > 30 and "| 1b4 | hwh |" in table
