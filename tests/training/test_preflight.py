"""Pre-flight checks of a run's mesh (``training.preflight``), before anything is written or
compiled: a batch that data x fsdp does not split, and a tensor axis that some layers' head
counts do not divide, each one line naming the values and the key that fixes them."""

import logging

import pytest

from configs import base
from hwh_jax.training import preflight
from hwh_jax.training.specs import model_for_run


def test_a_batch_the_data_parallel_devices_do_not_split_is_refused():
    with pytest.raises(
        ValueError,
        match=r"train.batch_size=256 does not split over data x "
        r"fsdp = 1024 devices \(train.mesh=1,1024,1\).*multiple of 1024",
    ):
        preflight.check_batch(256, {"data": 1, "fsdp": 1024, "tensor": 1})
    with pytest.raises(ValueError, match=r"train.grad_accum=4 leaves micro-batches of 8 rows"):
        preflight.check_batch(32, {"data": 2, "fsdp": 8, "tensor": 1}, grad_accum=4)
    with pytest.raises(ValueError, match="3 processes"):
        preflight.check_batch(8, {"data": 2, "fsdp": 1, "tensor": 1}, processes=3)
    preflight.check_batch(256, {"data": 4, "fsdp": 4, "tensor": 2}, grad_accum=4, processes=4)


def test_hwh_layers_a_tensor_axis_cannot_split_are_named():
    hwh = model_for_run(base.get_config("hwh_1b4"), 50304)
    assert preflight.unsplit_layers(hwh, 1) == []
    layers = preflight.unsplit_layers(hwh, 2)
    assert [i for i, _ in layers] == [
        i for i, s in enumerate(hwh.layers) if s.num_fa % 2 or s.num_la % 2
    ]
    assert layers[0] == (1, {"fa": 1, "la": 15})
    transformer = model_for_run(base.get_config("transformer_1b4"), 50304)
    assert preflight.unsplit_layers(transformer, 2) == []  # 16 heads a layer
    assert preflight.unsplit_layers(transformer, 3) != []


def test_a_tensor_axis_that_splits_heads_is_refused_or_warned(caplog):
    tiny = model_for_run(base.get_config("hwh_tiny"), 512)  # layers 1, 2: 3 FA + 5 GDN
    mesh = {"data": 2, "fsdp": 2, "tensor": 2}
    with pytest.raises(ValueError) as e:
        preflight.check_heads(tiny, mesh)
    message = str(e.value)
    assert "\n" not in message and "1 (fa 3 la 5), 2 (fa 3 la 5)" in message
    assert "train.mesh=2,4,1" in message and "train.allow_unsplit_heads=True" in message
    with caplog.at_level(logging.WARNING):
        assert preflight.check_heads(tiny, mesh, allow_unsplit=True) == [1, 2]
    assert "2 of the 4 layers" in caplog.text


def test_the_trainer_refuses_before_writing_anything(tmp_path):
    from hwh_jax.training.trainer import train_and_evaluate

    config = base.get_config("hwh_tiny")
    config.unlock()
    config.train.mesh = (1, 4, 2)  # 8 fake CPU devices
    with pytest.raises(ValueError, match="train.allow_unsplit_heads"):
        train_and_evaluate(config, tmp_path / "run")
    config.train.mesh, config.train.batch_size = (1, 8, 1), 12
    with pytest.raises(ValueError, match="train.batch_size=12 does not split"):
        train_and_evaluate(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_sequence_axis_that_does_not_divide_seq_len_is_refused():
    """The time shards are equal: seq_len 4095 over a sequence axis of 8 is refused, naming the
    key, the mesh and a length that splits; three mesh sizes leave the axis at 1."""
    from hwh_jax.training import sharding

    with pytest.raises(ValueError, match=r"seq_len=4095 .*train.mesh=1,1,1,8.*e.g. 4088"):
        preflight.check_sequence(4095, {"data": 1, "fsdp": 1, "tensor": 1, "sequence": 8})
    preflight.check_sequence(4096, {"data": 1, "fsdp": 1, "tensor": 1, "sequence": 8})
    assert sharding.mesh_shape((2, 2, 2), 8) == (2, 2, 2, 1)
    assert sharding.mesh_shape((1, 2, 1, -1), 8) == (1, 2, 1, 4)
    with pytest.raises(ValueError, match="3 or 4 sizes"):
        sharding.mesh_shape((1, 1), 8)


def test_every_default_has_one_definition():
    """A config with no overrides is its dataclasses' defaults: config.train is TrainSpec's
    fields and OptimizerSpec's (but train.steps, TrainSpec's), config.model's ModelConfig
    fields are ModelConfig's defaults, seq_len and seed TrainSpec's; a config saved before a
    train field existed takes TrainSpec's default; nothing below specs.py reads the run
    config's train section or seq_len."""
    import dataclasses
    import re
    from pathlib import Path

    from configs import base
    from hwh_jax.layers.config import ModelConfig
    from hwh_jax.training.optimizer import OptimizerSpec
    from hwh_jax.training.specs import TrainSpec, run_specs

    config = base.get_config("hwh_small")
    spec = run_specs(config, data_files=False)
    assert spec.train == TrainSpec()
    opt = {f.name for f in dataclasses.fields(OptimizerSpec)} - {"total_steps"}
    assert set(config.train) == set(TrainSpec.section_fields()) | opt
    assert spec.optimizer == OptimizerSpec()
    model = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    assert {k: config.model[k] for k in base.MODEL_FIELDS} == {
        k: model[k] for k in base.MODEL_FIELDS
    }
    old = config.copy_and_resolve_references()
    with old.unlocked():
        del old.train["eval_sequences"]  # a run saved before the key existed
    assert TrainSpec.from_config(old).eval_sequences == TrainSpec.eval_sequences
    root = Path(__file__).resolve().parents[2]
    reads = re.compile(r"config\.seq_len|config\.train\b|\.get\(\"(loggers|lease_seconds)\"")
    found = [
        f"{p.relative_to(root)}:{n}"
        for p in sorted((root / "hwh_jax").rglob("*.py"))
        if p.name != "specs.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if reads.search(line.split("#", 1)[0]) and "--config." not in line
    ]
    assert not found, found


def test_a_tpu_fsdp_axis_that_splits_weights_below_a_tile_is_refused(caplog):
    """On a TPU an fsdp axis leaving a weight shard fewer rows of d_model than a bf16 tile (16)
    is refused, naming the mesh that moves devices to data; other platforms, a shard of a
    tile, and train.allow_small_shards (a warning) pass."""
    check = preflight.check_weight_shards
    v6e = {"data": 1, "fsdp": 256, "tensor": 1}
    with pytest.raises(ValueError, match=r"8 rows of d_model 2048.*train.mesh=2,128,1"):
        check(2048, v6e, platform="tpu")
    with pytest.raises(ValueError, match=r"train.mesh=4,128,1,2\)"):
        check(2048, {"data": 2, "fsdp": 256, "tensor": 1, "sequence": 2}, platform="tpu")
    check(2048, v6e, platform="gpu")
    check(2048, {"data": 2, "fsdp": 128, "tensor": 1}, platform="tpu")
    with caplog.at_level("WARNING"):
        check(2048, v6e, platform="tpu", allow_small=True)
    assert "allow_small_shards=True" in caplog.text
