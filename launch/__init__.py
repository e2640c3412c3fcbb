"""Thin absl entry points; the logic lives in hwh_jax and is tested there.

Exit statuses of every launcher (docs/training.md, "Faults"): 0 done, or stopped by SIGTERM /
SIGINT with a complete checkpoint (``train.stop_exit_status`` sets another status for that
stop, e.g. 75 for a supervisor that relaunches); 1 the run failed and says what is kept (a
non-finite loss, a diverged run, a checkpoint that could not be written, a process of the job
that is gone); 2 the run was refused before it started (a bad config value, data that cannot be
read, a workdir made by another config or in use by another run). A failure prints one line;
the traceback goes to the log file (a launcher's workdir's ``<name>.log``) and, with
``--verbosity=1``, to the console.
"""

import contextlib
import logging
import os
import shutil
import sys
import tempfile

from hwh_jax import storage

EXIT_FAILED, EXIT_REFUSED = 1, 2
_log = logging.getLogger("launch")


# library detail (matplotlib: its font cache, built on a first run; a bucket client's retry
# tracebacks): the log file, not the console
NOISY = ("asyncio", "orbax", "etils", "absl", "matplotlib", "gcsfs", "s3fs", "aiohttp", "fsspec")


def setup_logging(log_file: storage.PathLike | None = None) -> None:
    """INFO from the project's loggers on the console (libraries' records only with
    ``--verbosity=1``); with ``log_file``, every INFO record and the project's tracebacks of
    handled failures into that file (every DEBUG record too with ``--verbosity=1``; a bucket
    URL: written locally and copied up at checkpoints and at exit, ``storage.Staged``)."""
    from absl import flags
    from absl import logging as absl_logging

    verbose = flags.FLAGS.is_parsed() and flags.FLAGS.verbosity >= 1
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if log_file else logging.INFO)
    console = absl_logging.get_absl_handler()
    console.setLevel(logging.DEBUG if verbose else logging.INFO)
    if not verbose:
        console.addFilter(_Quiet())
    if log_file:
        target = storage.path(log_file)
        log_file = storage.Staged(target.parent).local / target.name
        handler = logging.FileHandler(log_file)
        handler.setLevel(logging.DEBUG)
        if not verbose:  # --verbosity=1: every library's DEBUG records too
            handler.addFilter(_InfoAndTracebacks())
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)


def _closed_loop(kind, value) -> bool:
    return kind is RuntimeError and str(value) == "Event loop is closed"


def _quiet_closed_loops():
    """``sys.excepthook`` and ``sys.unraisablehook`` less one message: after a failed
    asynchronous checkpoint write, TensorStore's pending callbacks meet Orbax's closed event
    loop and each reports ``RuntimeError: Event loop is closed`` as an unraisable error
    (hundreds, around the one line that matters). Those go to the log file at DEBUG; every
    other error is reported as before."""
    excepthook, unraisablehook = sys.excepthook, sys.unraisablehook

    def on_exception(kind, value, tb):
        if _closed_loop(kind, value):
            _log.debug(
                "a late asynchronous callback met a closed event loop", exc_info=(kind, value, tb)
            )
            return
        excepthook(kind, value, tb)

    def on_unraisable(u):
        if _closed_loop(u.exc_type, u.exc_value):
            _log.debug(
                "a late asynchronous callback met a closed event loop",
                exc_info=(u.exc_type, u.exc_value, u.exc_traceback),
            )
            return
        unraisablehook(u)

    sys.excepthook, sys.unraisablehook = on_exception, on_unraisable


def begin(log_file=None) -> None:
    """A launcher's first call: the device defaults and several processes (``devices.start``,
    before any device use), then ``setup_logging`` (``log_file``: a path, or a function of the
    process index that gives one), then the log's first lines: what the defaults set."""
    from launch import devices

    _quiet_closed_loops()
    started = devices.start()
    if callable(log_file):
        import jax

        log_file = log_file(jax.process_index())
    setup_logging(log_file)
    for line in started:
        logging.info("%s", line)


@contextlib.contextmanager
def first_process_writes(out: storage.PathLike | None = None):
    """For the evaluation launchers in a job of several processes, where every process computes
    the same thing on its own devices: yields the folder to write to, ``out`` on the first
    process and a scratch folder (removed after) on the others, whose console output is also
    dropped, so plots, JSON and printed results come once. A single process: ``out`` itself."""
    import jax

    if jax.process_index() == 0:
        yield None if out is None else storage.path(out)
        return
    scratch = tempfile.mkdtemp(prefix=f"hwh_jax_process{jax.process_index()}_")
    stdout, sys.stdout = sys.stdout, open(os.devnull, "w")
    try:
        yield storage.path(scratch)
    finally:
        sys.stdout.close()
        sys.stdout = stdout
        shutil.rmtree(scratch, ignore_errors=True)


class _Quiet(logging.Filter):
    """Keeps the libraries' records (``NOISY``) off the console."""

    def filter(self, record):
        return not record.name.startswith(NOISY)


OURS = ("hwh_jax", "launch", "kernels_pallas", "root")


class _InfoAndTracebacks(logging.Filter):
    """The log file's records without ``--verbosity=1``: INFO and above from everyone, and the
    project's DEBUG records that carry a traceback (how handled failures are kept); the other
    DEBUG records (Orbax's and asyncio's were thousands of lines for a tiny run) only with the
    flag."""

    def filter(self, record):
        return record.levelno >= logging.INFO or (
            record.exc_info is not None and record.name.startswith(OURS)
        )


@contextlib.contextmanager
def one_line_errors():
    """Known failures as one line on stderr and the documented exit status (module docstring);
    the traceback to the log, and to the console with ``--verbosity=1``."""
    from absl import flags

    from hwh_jax.training.checkpoint import CheckpointWriteError

    verbose = flags.FLAGS.is_parsed() and flags.FLAGS.verbosity >= 1
    try:
        yield
    except (FloatingPointError, CheckpointWriteError) as e:
        storage.sync_all()  # a bucket's staged files (the log saying why) go up first
        _fail(e, EXIT_FAILED, verbose)
    except (ValueError, KeyError, FileNotFoundError, NotADirectoryError) as e:
        storage.sync_all()
        _fail(e, EXIT_REFUSED, verbose)
    except OSError as e:
        storage.sync_all()
        _fail(e, EXIT_FAILED, verbose)
    except RuntimeError as e:  # a collective with a process that is gone: one line
        if not (_several_processes() and any(s in str(e) for s in _PEER_GONE)):
            raise
        _fail(e, EXIT_FAILED, verbose)
    else:
        storage.sync_all()


def run_main(main) -> None:
    """``absl.app.run(main)``, with what flag parsing meets as one line and exit status 2: a
    config file that cannot be read, a ``--config.KEY`` override naming no key (with the
    key it most likely meant), any other bad flag."""
    from absl import app

    from launch import devices

    devices.skip_tpu_probe()
    app.run(main, flags_parser=_parse_flags)


def _parse_flags(argv):
    from absl import flags

    try:
        try:
            rest = flags.FLAGS(argv)
        except SystemExit:  # absl ends --help (and --helpfull, ...) with status 1
            if any(
                a.lstrip("-").split("=")[0]
                in ("help", "helpfull", "helpshort", "helpxml", "h", "?")
                for a in argv[1:]
            ):
                sys.exit(0)
            raise
        if "config" in flags.FLAGS:
            config = flags.FLAGS.config
            if type(config).__name__ == "_ErrorConfig":  # ml_collections' failed load
                str(config.anything)  # raises its error
        return rest
    except flags.Error as e:
        message = " ".join(str(e).split())
    except (AttributeError, KeyError) as e:  # ml_collections: an override of a missing key
        text = str(e.args[0] if e.args else e)
        text = text.replace("\\n", " ").replace("\\'", "").replace("\n", " ").replace("'", "")
        message = "a --config override names no key of the config: " + " ".join(text.split())
    except Exception as e:  # noqa: BLE001 - ml_collections' config-file errors have no one type
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        message = f"--config: {lines[-1] if lines else type(e).__name__}"
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_REFUSED)


_PEER_GONE = (
    "Connection reset by peer",
    "Connection refused",
    "Gloo",
    "Broken pipe",
    "failed to connect to all addresses",
    "Socket closed",
)


def _several_processes() -> bool:
    try:
        import jax

        return jax.process_count() > 1
    except Exception:  # noqa: BLE001 - before or without a backend: one process
        return False


def _fail(e: BaseException, status: int, verbose: bool):
    _log.debug("failed", exc_info=True)
    if verbose:
        raise e
    message = str(e) if not isinstance(e, KeyError) else str(e.args[0]) if e.args else repr(e)
    several = _several_processes()
    if several and any(s in message for s in _PEER_GONE):
        status = EXIT_FAILED  # however the failure surfaced (a ValueError included)
        message += (
            " (another process of the job is gone or unreachable: the checkpoints in "
            "the workdir stay; relaunch every process to resume from the newest)"
        )
    print(f"error: {message}", file=sys.stderr, flush=True)
    if several:
        # jax.distributed's shutdown at exit waits for every process at a barrier (minutes,
        # for a peer that is gone): the log is flushed and the process ends here instead
        logging.shutdown()
        os._exit(status)
    sys.exit(status)
