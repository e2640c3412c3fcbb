"""Where data files and the project's caches live.

A relative data path names a file or folder of the shipped data (``hwh_jax/assets``, see its
README) or, failing that, of the user's data folder (``data.data_dir`` or ``$HWH_DATA_DIR``).
An absolute path, a bucket URL (``gs://``, ``s3://``; ``hwh_jax.storage``), or a path that
exists from the working directory, is taken as given. Caches are always on the local disk.
"""

from __future__ import annotations

import os
from pathlib import Path

from hwh_jax import storage

ASSETS = Path(__file__).resolve().parents[1] / "assets"  # local path: shipped files


def user_data_dir(override: str | None = None):
    """The user's own data folder (a local folder or a bucket URL): ``override``
    (``data.data_dir``), else $HWH_DATA_DIR."""
    folder = override or os.environ.get("HWH_DATA_DIR")
    return storage.path(folder) if folder else None


def resolve(path: storage.PathLike, data_dir: str | None = None):
    """The file or folder a data path names; FileNotFoundError saying where it looked."""
    p = storage.path(path)
    if storage.is_remote(p) or p.is_absolute() or p.exists():
        if not p.exists():
            raise FileNotFoundError(f"data path {str(path)!r} not found")
        return p
    looked = [ASSETS / p]
    user = user_data_dir(data_dir)
    if user is not None:
        looked.append(user / p)
    for candidate in looked:
        if candidate.exists():
            return candidate
    raise FileNotFoundError(
        f"data path {str(path)!r} not found (looked in {', '.join(str(c) for c in looked)}); "
        "give an absolute path, or put it under the folder named by data.data_dir or "
        "$HWH_DATA_DIR"
    )


def cache_dir() -> Path:
    """Tokenised corpora and trained tokenizers: $HWH_CACHE_DIR or ~/.cache/hwh_jax (a local
    disk: each host keeps its own)."""
    return storage.cache_root()
