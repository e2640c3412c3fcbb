"""The launchers' device defaults: set per platform, never over the user's own settings."""

from launch import devices


def test_gpu_defaults_are_added_and_listed():
    env = {"JAX_PLATFORMS": "cuda"}
    made = devices.apply_defaults(env)
    assert env["XLA_FLAGS"] == (
        "--xla_gpu_enable_command_buffer= --xla_gpu_enable_triton_gemm=false"
    )
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.95"
    assert made == [
        "XLA_FLAGS += --xla_gpu_enable_command_buffer=",
        "XLA_FLAGS += --xla_gpu_enable_triton_gemm=false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION=0.95",
    ]
    assert devices.apply_defaults(env) == []  # a second call changes nothing


def test_the_users_own_settings_win():
    env = {
        "JAX_PLATFORMS": "gpu",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5",
        "XLA_FLAGS": "--xla_gpu_enable_triton_gemm=true --xla_dump_to=/tmp/d",
    }
    made = devices.apply_defaults(env)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"
    assert env["XLA_FLAGS"] == (
        "--xla_gpu_enable_triton_gemm=true --xla_dump_to=/tmp/d --xla_gpu_enable_command_buffer="
    )
    assert made == ["XLA_FLAGS += --xla_gpu_enable_command_buffer="]


def test_tpu_defaults_go_to_libtpu_and_cpu_gets_none():
    env = {
        "JAX_PLATFORMS": "tpu",
        "LIBTPU_INIT_ARGS": "--xla_tpu_overlap_compute_collective_tc=false",
    }
    made = devices.apply_defaults(env)
    args = env["LIBTPU_INIT_ARGS"].split()
    assert "--xla_tpu_overlap_compute_collective_tc=false" in args
    assert "--xla_tpu_overlap_compute_collective_tc=true" not in args
    assert "--xla_tpu_enable_async_collective_fusion=true" in args and len(made) == 4
    assert "XLA_FLAGS" not in env
    env = {"JAX_PLATFORMS": "cpu"}
    assert devices.apply_defaults(env) == [] and env == {"JAX_PLATFORMS": "cpu"}


def test_the_platform_from_the_machine(tmp_path):
    assert devices.platform({}, dev=tmp_path) == "cpu"
    (tmp_path / "nvidia0").touch()
    assert devices.platform({}, dev=tmp_path) == "gpu"
    assert devices.platform({"JAX_PLATFORMS": "cpu"}, dev=tmp_path) == "cpu"
    (tmp_path / "nvidia0").unlink()
    (tmp_path / "accel0").touch()
    assert devices.platform({}, dev=tmp_path) == "tpu"


def test_several_processes_are_recognised():
    assert not devices.several_processes({})
    assert not devices.several_processes({"TPU_WORKER_HOSTNAMES": "host0", "SLURM_NTASKS": "1"})
    assert devices.several_processes({"JAX_COORDINATOR_ADDRESS": "h:1234"})
    assert devices.several_processes({"TPU_WORKER_HOSTNAMES": "h0,h1"})
    assert devices.several_processes({"SLURM_NTASKS": "4"})


def test_no_tpu_probe_off_a_tpu_host():
    """With libtpu installed (the tpu-plan extra) JAX would probe for a TPU at its first use
    and print libtpu's warnings: off a TPU host the launchers name the platforms instead."""
    env = {}
    assert devices.skip_tpu_probe(env) and env["JAX_PLATFORMS"] == "cpu"  # this CPU machine
    env = {"TPU_ACCELERATOR_TYPE": "v5p-8"}
    assert not devices.skip_tpu_probe(env) and "JAX_PLATFORMS" not in env
    env = {"JAX_PLATFORMS": "cuda"}
    assert not devices.skip_tpu_probe(env) and env["JAX_PLATFORMS"] == "cuda"
