"""Where the shared data and the project's caches live."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir(override: str | None = None) -> Path:
    """The shared data folder: ``override``, else $HWH_DATA_DIR, else ../shared/data beside the
    checkout (also tried beside the working directory)."""
    if override:
        return Path(override)
    if os.environ.get("HWH_DATA_DIR"):
        return Path(os.environ["HWH_DATA_DIR"])
    for root in (REPO_ROOT, Path.cwd()):
        candidate = root.parent / "shared" / "data"
        if candidate.is_dir():
            return candidate
    return REPO_ROOT.parent / "shared" / "data"


def cache_dir() -> Path:
    """Tokenised corpora and trained tokenizers: $HWH_CACHE_DIR or ~/.cache/hwh_jax."""
    path = Path(os.environ.get("HWH_CACHE_DIR", Path.home() / ".cache" / "hwh_jax"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def resolve(path: str, base: str | None = None) -> Path:
    """A data path as given if absolute or existing, else relative to the data folder."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    return data_dir(base) / p
