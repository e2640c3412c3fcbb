"""Where a run's files live: a local folder or an object-store URL (``gs://``, ``s3://``), behind
one path type.

Every read and write of a run or data location goes through ``path(p)``: a ``pathlib.Path``
for a local path, an ``etils.epath.Path`` for a URL (the path type Orbax uses too; ``pathlib``'s
interface, through fsspec: ``gcsfs`` for ``gs://``, ``s3fs`` for ``s3://``). Code written
against that common interface (``/``, ``exists``, ``read_text``, ``write_text``, ``open``,
``mkdir``, ``glob("*")``, ``rename``, ``unlink``) serves both; ``size`` reads a file's length
from either. A URL whose
filesystem package is not installed is refused at once (``MissingBackend``: one line naming the
package), before anything is written; ``pathlib.Path("gs://b/x")`` would silently be the local
folder ``gs:/b/x``.

An object store has no appending and no file locks, and some native readers (ArrayRecord,
SentencePiece) open local files only. Two helpers cover that:

- ``Staged``: a local folder mirrored to a remote one by ``sync()`` (files whose size or time
  changed are uploaded): TensorBoard events, log files and profiles are written locally and
  copied up at checkpoints and at exit (``sync_all``, also registered with ``atexit``).
- ``local_copy``: a remote file downloaded once into the local cache (size-checked, written
  under a temporary name then renamed, so concurrent readers never see half a file).

gs:// goes through gcsfs even where TensorFlow is installed (epath would pick TF's gfile; one
client, the one named in the error, is simpler to configure: ``STORAGE_EMULATOR_HOST``,
``FSSPEC_GS_TOKEN``).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import importlib.util
import logging
import os
import pathlib
import shutil
import threading

os.environ.setdefault("EPATH_USE_TF", "false")  # before epath decides on a backend
from etils import epath  # the setting above must come first

log = logging.getLogger(__name__)
PathLike = epath.PathLike  # a str, pathlib.Path or epath.Path

# scheme -> (the module fsspec needs, what to install)
BACKENDS = {
    "gs": ("gcsfs", 'pip install "hwh-jax[gcs]"  (gcsfs)'),
    "s3": ("s3fs", 'pip install "hwh-jax[s3]"  (s3fs)'),
}


class MissingBackend(ValueError):
    """A URL whose filesystem package is not installed (or a scheme not supported)."""


def scheme(p) -> str | None:
    """``"gs"`` of ``"gs://b/x"``; None for a local path."""
    text = os.fspath(p) if not isinstance(p, str) else p
    head, sep, _ = text.partition("://")
    return head if sep and head.isalnum() else None


def is_remote(p) -> bool:
    return scheme(p) is not None


def check_backend(p) -> None:
    """Raise ``MissingBackend`` naming what to install if ``p`` is a URL this process cannot
    reach."""
    s = scheme(p)
    if s is None:
        return
    if s not in BACKENDS:
        raise MissingBackend(
            f"{p}: the {s}:// scheme is not supported (gs:// and s3:// are, or a local path)"
        )
    module, install = BACKENDS[s]
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:
        found = False
    if not found:
        raise MissingBackend(
            f"{p}: {s}:// needs the {module} package, which is not installed: {install}"
        )


class Unreachable(ValueError):
    """A bucket URL whose storage service does not answer."""


def endpoint(p) -> tuple[str, int] | None:
    """(host, port) of the service that stores URL ``p`` (the emulator's or endpoint
    override's where one is set: ``STORAGE_EMULATOR_HOST`` for gs://, ``AWS_ENDPOINT_URL_S3`` /
    ``AWS_ENDPOINT_URL`` for s3://); None for a local path."""
    import urllib.parse

    s = scheme(p)
    if s is None:
        return None
    default = {"gs": "https://storage.googleapis.com", "s3": "https://s3.amazonaws.com"}[s]
    names = {"gs": ("STORAGE_EMULATOR_HOST",), "s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")}
    url = next((os.environ[n] for n in names[s] if os.environ.get(n)), default)
    url = url if "://" in url else "http://" + url
    parsed = urllib.parse.urlsplit(url)
    return parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)


def check_reachable(p, timeout: float = 10.0) -> None:
    """Raise ``Unreachable`` (one line) if the service storing URL ``p`` takes no connection
    within ``timeout`` seconds: the store's client retries for a minute or more, printing a
    traceback a try, before it gives up. Nothing for a local path."""
    import socket

    where = endpoint(p)
    proxied = any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY"))
    if where is None or proxied:  # behind a proxy the service is reached through it
        return
    try:
        socket.create_connection(where, timeout=timeout).close()
    except OSError as e:
        raise Unreachable(
            f"{p}: the storage service at {where[0]}:{where[1]} cannot be reached "
            f"({e.strerror or e}): check the network, or the endpoint setting"
        ) from None


def path(p):
    """``p`` (a str, pathlib.Path or epath.Path): a URL as an ``epath.Path`` (its backend
    checked: ``MissingBackend``), a local path as a ``pathlib.Path``."""
    check_backend(p)
    return epath.Path(p) if is_remote(p) else pathlib.Path(os.fspath(p))


def absolute(p):
    """``path(p)``, made absolute on a local disk (a URL is absolute already)."""
    out = path(p)
    return out if is_remote(out) else out.resolve()


def size(p) -> int:
    """A file's length in bytes, local or remote."""
    p = path(p)
    return p.stat().length if is_remote(p) else p.stat().st_size


class NotWritable(ValueError):
    """A folder that cannot be made or written (read-only, no permission)."""


@contextlib.contextmanager
def writable(p, what: str = "--workdir"):
    """Writes to folder ``p`` inside: where the file system or store says no (read-only, no
    permission), one line (``NotWritable``, named by ``what``) instead of the OSError."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise NotWritable(
            f"{what}={p} cannot be written ({e.strerror}): choose a folder you can write"
        ) from None


def make_folder(p, what: str = "--workdir") -> None:
    """Make folder ``p`` (and its parents), refusing as ``writable`` does."""
    with writable(p, what):
        path(p).mkdir(parents=True, exist_ok=True)


def write_text(p, text: str) -> None:
    """Write a whole small file so that a reader sees the old or the new text, never a part:
    a temporary name then a rename on a local disk; an object upload is atomic already."""
    p = path(p)
    if is_remote(p):
        p.write_text(text)
        return
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(p)


# ------------------------------------------------------------------ local copies of remote files
def cache_root() -> pathlib.Path:
    """Local caches: $HWH_CACHE_DIR or ~/.cache/hwh_jax (always a local disk: a cache is a
    host's own)."""
    root = pathlib.Path(os.environ.get("HWH_CACHE_DIR", pathlib.Path.home() / ".cache" / "hwh_jax"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _local_name(url: str) -> pathlib.Path:
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    return cache_root() / "remote" / digest


def staging_folder(remote) -> pathlib.Path:
    """A local folder (made) standing for the remote folder ``remote``, for writers that need a
    local disk; the caller uploads what it writes there (``Staged`` does it by ``sync``)."""
    folder = _local_name(os.fspath(path(remote))) / "staged"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def local_copy(p, *, expected_size: int | None = None) -> pathlib.Path:
    """A local file with ``p``'s bytes: ``p`` itself if local, else a copy in the cache
    (downloaded once; fetched again if its size differs from the remote's, or from
    ``expected_size``)."""
    if not is_remote(p):
        return pathlib.Path(os.fspath(p))
    src = path(p)
    dst = _local_name(os.fspath(src).rsplit("/", 1)[0]) / src.name
    want = expected_size if expected_size is not None else size(src)
    if dst.exists() and dst.stat().st_size == want:
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.{threading.get_ident()}.part")
    log.info("copying %s to %s (%d bytes)", src, dst, want)
    with src.open("rb") as a, open(tmp, "wb") as b:
        shutil.copyfileobj(a, b, 1 << 20)
    got = tmp.stat().st_size
    if got != want:
        tmp.unlink()
        raise OSError(f"{src}: read {got} bytes where {want} were expected")
    tmp.replace(dst)
    return dst


# ------------------------------------------------------------------ staged folders
class Staged:
    """A local folder whose files are uploaded to ``remote`` by ``sync()`` (for writers that
    append or need a local file: TensorBoard, log files, profiles). For a local ``remote`` the
    folder is ``remote`` itself and ``sync`` does nothing."""

    def __init__(self, remote):
        self.remote = path(remote)
        if is_remote(self.remote):
            self.local = staging_folder(self.remote)
        else:
            self.local = pathlib.Path(os.fspath(self.remote))
            self.local.mkdir(parents=True, exist_ok=True)
        self._sent: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()
        if is_remote(self.remote):
            _STAGED.append(self)

    def sync(self) -> int:
        """Upload the files that changed since the last sync; returns how many."""
        if not is_remote(self.remote):
            return 0
        sent = 0
        with self._lock:
            for f in sorted(self.local.rglob("*")):
                if not f.is_file():
                    continue
                rel = f.relative_to(self.local).as_posix()
                st = f.stat()
                key = (st.st_size, st.st_mtime_ns)
                if self._sent.get(rel) == key:
                    continue
                target = self.remote / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(f.read_bytes())
                self._sent[rel] = key
                sent += 1
        return sent


_STAGED: list[Staged] = []


def sync_all(level: int = logging.WARNING) -> None:
    """Upload what every staged folder of this process has changed (at checkpoints, at the end
    of a launcher); a failure is logged at ``level``, not raised: the checkpoints are the
    run's record, these are its side outputs."""
    for staged in list(_STAGED):
        try:
            staged.sync()
        except Exception:  # any storage error: say it, keep the run going
            log.log(level, "could not upload %s to %s", staged.local, staged.remote, exc_info=True)


# A last try at exit (the launchers sync before they return; by the time atexit runs, fsspec
# may have closed its HTTP connections, so a failure here is only a debug record).
atexit.register(sync_all, logging.DEBUG)
