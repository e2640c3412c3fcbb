"""What a launcher sets up before JAX starts its backend: device defaults and several processes.

``apply_defaults`` sets, only where the user has not, the settings measured or recommended for
the platform the process will run on (docs/training.md, "Device defaults"):

- GPU: ``XLA_FLAGS`` ``--xla_gpu_enable_command_buffer=`` (no CUDA-graph capture of the step:
  the step is long, capture only costs) and ``--xla_gpu_enable_triton_gemm=false`` (cuBLAS for
  every matmul), and ``XLA_PYTHON_CLIENT_MEM_FRACTION=0.95`` (the allocator may take 95% of the
  GPU, not 75%): together measured faster on an H200 (docs/benchmarks.md).
- TPU: ``LIBTPU_INIT_ARGS`` the collective-overlap flags of MaxText's TPU recipes
  (asynchronous collective fusion, all-gathers overlapped with compute), which matter for the
  FSDP all-gathers of a sharded run.
- CPU: nothing (several processes on CPU also get ``jax_cpu_collectives_implementation=gloo``,
  without which they cannot run one program).

A flag the user's ``XLA_FLAGS`` / ``LIBTPU_INIT_ARGS`` already names is left as the user set it;
a variable the user set is not touched. ``init_distributed`` starts ``jax.distributed`` when
the environment describes several processes.
"""

from __future__ import annotations

import os
from pathlib import Path

GPU_XLA_FLAGS = (("--xla_gpu_enable_command_buffer", ""), ("--xla_gpu_enable_triton_gemm", "false"))
GPU_ENV = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"}
TPU_LIBTPU_FLAGS = (
    ("--xla_tpu_enable_async_collective_fusion", "true"),
    ("--xla_tpu_enable_async_collective_fusion_fuse_all_gather", "true"),
    ("--xla_tpu_enable_async_collective_fusion_multiple_steps", "true"),
    ("--xla_tpu_overlap_compute_collective_tc", "true"),
    ("--xla_enable_async_all_gather", "true"),
)


def platform(environ=os.environ, dev: Path = Path("/dev")) -> str:  # local path: devices
    """ "gpu", "tpu" or "cpu": from ``JAX_PLATFORMS`` when set, else from the devices the
    machine has (NVIDIA device files; TPU accelerator files or a TPU VM's variables)."""
    chosen = environ.get("JAX_PLATFORMS", "").split(",")[0].strip().lower()
    if chosen:
        return {"cuda": "gpu", "rocm": "gpu"}.get(chosen, chosen)
    if (dev / "nvidia0").exists() or (dev / "nvidiactl").exists():
        return "gpu"
    if (
        (dev / "accel0").exists()
        or (dev / "vfio" / "0").exists()
        or environ.get("TPU_ACCELERATOR_TYPE")
        or environ.get("TPU_WORKER_HOSTNAMES")
    ):
        return "tpu"
    return "cpu"


def skip_tpu_probe(environ=os.environ) -> bool:
    """On a machine with no TPU, and ``JAX_PLATFORMS`` unset, name the platforms JAX should
    start ("cpu", or "cuda,cpu" with NVIDIA devices), so that an installed TPU compiler
    (``libtpu``, e.g. for ``launch.plan``) is not probed for a chip and its warnings stay off the
    console. A TPU host is left as it is. True if set."""
    if environ.get("JAX_PLATFORMS") or platform(environ) == "tpu":
        return False
    environ["JAX_PLATFORMS"] = "cuda,cpu" if platform(environ) == "gpu" else "cpu"
    return True


def _merge(current: str, flags) -> tuple[str, list[str]]:
    named = {tok.split("=")[0] for tok in current.split()}
    added = [f"{k}={v}" for k, v in flags if k not in named]
    return " ".join([current.strip(), *added]).strip(), added


def apply_defaults(environ=os.environ, on: str | None = None) -> list[str]:
    """Set the defaults of platform ``on`` (default: ``platform()``) in ``environ``; returns
    one line per setting made (for the run log)."""
    on = on or platform(environ)
    made = []
    if on == "gpu":
        environ["XLA_FLAGS"], added = _merge(environ.get("XLA_FLAGS", ""), GPU_XLA_FLAGS)
        made += [f"XLA_FLAGS += {a}" for a in added]
        for k, v in GPU_ENV.items():
            if k not in environ:
                environ[k] = v
                made.append(f"{k}={v}")
    elif on == "tpu":
        environ["LIBTPU_INIT_ARGS"], added = _merge(
            environ.get("LIBTPU_INIT_ARGS", ""), TPU_LIBTPU_FLAGS
        )
        made += [f"LIBTPU_INIT_ARGS += {a}" for a in added]
    return made


def several_processes(environ=os.environ) -> bool:
    """Whether the environment describes a job of several processes: a coordinator address
    (``JAX_COORDINATOR_ADDRESS``, with ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` where no
    cluster manager says them), a TPU slice of several hosts, or a SLURM job of several tasks."""
    return bool(
        environ.get("JAX_COORDINATOR_ADDRESS")
        or "," in environ.get("TPU_WORKER_HOSTNAMES", "")
        or int(environ.get("SLURM_NTASKS", "1")) > 1
    )


def init_distributed(environ=os.environ) -> str | None:
    """Start ``jax.distributed`` when ``several_processes``; returns a line for the log."""
    if not several_processes(environ):
        return None
    import jax

    kw = {}
    if environ.get("JAX_NUM_PROCESSES"):
        kw["num_processes"] = int(environ["JAX_NUM_PROCESSES"])
    if environ.get("JAX_PROCESS_ID"):
        kw["process_id"] = int(environ["JAX_PROCESS_ID"])
    if platform(environ) == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**kw)
    if platform(environ) == "cpu":
        # gloo builds its context at a job's first collective and waits only 30 s for every
        # process to arrive; the processes leave initialize() together, but reach the train
        # step's first collective after compilations that can differ by more than that on a
        # loaded machine. One collective now builds the context while they are together.
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("hwh_jax: CPU collectives")
    from kernels_pallas import compat
    from launch import peers

    client = compat.coordination_client()  # no public accessor
    if client is not None:
        peers.watch(client, jax.process_index(), jax.process_count())
    return (
        f"process {jax.process_index()} of {jax.process_count()}: "
        f"{jax.local_device_count()} local of {jax.device_count()} devices"
        + (
            ""
            if client is not None
            else f"; no peer watchdog (JAX {jax.__version__} has no "
            "coordination client where kernels_pallas.compat looks)"
        )
    )


def start(environ=os.environ) -> list[str]:
    """A launcher's first call: defaults, then several processes. Lines for the log."""
    lines = [f"device default: {m} (set it yourself to change it)" for m in apply_defaults(environ)]
    line = init_distributed(environ)
    return lines + ([line] if line else [])
