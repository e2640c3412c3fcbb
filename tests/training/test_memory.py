"""Memory planning and gradient accumulation: the planner's choices against a known memory
curve, the accumulated update against the whole batch's, and the trainer's plan under a limit."""

import json
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from hwh_jax.data.paths import resolve
from hwh_jax.data.sources import read_text
from hwh_jax.training import memory
from hwh_jax.training.optimizer import make_optimizer
from hwh_jax.training.specs import model_for_run, run_specs
from hwh_jax.training.state import init_train_state, train_state_shardings
from hwh_jax.training.steps import _split_micro, make_train_step
from hwh_jax.training.trainer import train_and_evaluate

GiB = memory.GiB


class _Compiled:
    """A stand-in for a compiled step whose memory analysis reports ``nbytes``."""

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def memory_analysis(self):
        return types.SimpleNamespace(
            argument_size_in_bytes=self.nbytes,
            output_size_in_bytes=0,
            alias_size_in_bytes=0,
            temp_size_in_bytes=0,
            generated_code_size_in_bytes=0,
        )


def _curve(fixed, per_seq, extra=lambda m: 0):
    compiled = []

    def compile_at(m):
        compiled.append(m)
        return _Compiled(int(fixed + per_seq * m + extra(m)))

    return compile_at, compiled


def test_candidates_are_the_most_even_micro_batch_for_each_count():
    """For each number of micro-batches n, the smallest multiple of the data-parallel size that
    holds the batch in n: 256 on one device in 6 is 43 (5 of 43, the last of 41)."""
    assert memory.candidates(256, 1)[:8] == [256, 128, 86, 64, 52, 43, 37, 32]
    assert memory.candidates(256, 8) == [256, 128, 88, 64, 56, 48, 40, 32, 24, 16, 8]
    assert memory.candidates(48, 8) == [48, 24, 16, 8]
    assert memory.candidates(4, 8) == [] and memory.candidates(12, 8) == []
    assert memory.accumulation(256, 43) == (6, 41) and memory.accumulation(256, 32) == (8, 0)
    assert memory.accumulation(256, 88) == (3, 80) and memory.accumulation(8, 3) == (3, 2)
    # every split computes the batch's rows once: fewer micro-batches are cheaper
    assert memory.cost(256, 43) < memory.cost(256, 32) < memory.cost(256, 24)


@pytest.mark.parametrize("limit_gib,want", [(100, 256), (50, 128), (15, 32), (5, 8)])
def test_plan_takes_the_largest_micro_batch_that_fits(limit_gib, want):
    """Linear memory (2 GiB fixed + 0.3 GiB a sequence), dp=8: the largest candidate under
    90% of the limit, found in at most three compiles, the last being the step returned."""
    compile_at, compiled = _curve(2 * GiB, 0.3 * GiB)
    got, step = memory.plan(compile_at, batch=256, dp=8, limit=int(limit_gib * GiB))
    budget = memory.HEADROOM * limit_gib * GiB
    fits = [m for m in memory.candidates(256, 8) if 2 * GiB + 0.3 * GiB * m <= budget]
    assert got.micro_batch == want == fits[0] and got.grad_accum == 256 // want
    assert step.nbytes == got.step_bytes <= budget
    assert len(compiled) <= 3 and want in compiled


def test_plan_takes_a_micro_batch_that_does_not_divide_the_batch():
    """One device, room for 44 of 256 sequences: 6 x 43 (the last of 41), not 8 x 32."""
    compile_at, compiled = _curve(10 * GiB, 2 * GiB)
    got, _ = memory.plan(compile_at, batch=256, dp=1, limit=int((10 + 2 * 44.5) / 0.9 * GiB))
    assert (got.micro_batch, got.grad_accum, got.last) == (43, 6, 41)
    assert "micro-batch 43 x 6 accumulated (the last of 41)" in got.describe()
    assert len(compiled) == 3


def test_plan_steps_down_when_memory_is_not_linear():
    """A jump above 64 sequences (a different fusion, a workspace): the line predicts 128 fits,
    its compile says no, the plan takes the next candidate down."""
    compile_at, compiled = _curve(GiB, 0.1 * GiB, extra=lambda m: 30 * GiB if m > 64 else 0)
    got, _ = memory.plan(compile_at, batch=256, dp=8, limit=40 * GiB)
    assert got.micro_batch == 64 and 128 in compiled and got.step_bytes <= 36 * GiB


def test_the_planner_tries_the_remat_policies_that_keep_less_before_it_gives_up():
    """None does not fit one sequence a device, save_dots does not either, save_dots_except_mlp
    does: the plan runs it and names the two that did not fit; when none fits, the last
    policy's error. The order is layers/remat.py's (offload only off a CPU)."""
    from hwh_jax.layers import remat

    fixed = {"none": 60, "save_dots": 45, "save_dots_except_mlp": 30, "save_qkv_proj": 25}
    curves = {p: _curve(f * GiB, GiB)[0] for p, f in fixed.items()}
    policies = ("none", "save_dots", "save_dots_except_mlp", "save_qkv_proj")
    got, _ = memory.plan_remat(curves.__getitem__, policies, batch=16, dp=1, limit=40 * GiB)
    assert got.remat == "save_dots_except_mlp" and got.remat_tried == ("none", "save_dots")
    assert "model.remat=save_dots_except_mlp (none, save_dots did not fit" in got.describe()
    assert got.to_json()["remat"] == "save_dots_except_mlp"
    with pytest.raises(memory.MemoryPlanError, match="does not fit even"):
        memory.plan_remat(curves.__getitem__, policies[:2], batch=16, dp=1, limit=40 * GiB)
    assert remat.fallbacks("none", "cpu") == remat.PLANNER_ORDER[:-1]
    assert remat.fallbacks("block", "gpu") == ("full", "offload")
    assert remat.fallbacks("minimal", "tpu") == ("minimal", "full", "offload")


def test_a_config_that_cannot_fit_names_the_memory_and_the_remedies():
    compile_at, _ = _curve(50 * GiB, GiB)
    with pytest.raises(memory.MemoryPlanError) as e:
        memory.plan(compile_at, batch=16, dp=2, limit=40 * GiB, advice=lambda: "ADVICE")
    msg = str(e.value)
    assert "1 sequence(s) per device" in msg and "52.00 GiB" in msg and "36.00 GiB" in msg
    assert "40.00 GiB" in msg and msg.endswith("ADVICE")


def test_a_set_grad_accum_is_honoured_and_checked():
    compile_at, compiled = _curve(GiB, GiB)
    got, _ = memory.plan(compile_at, batch=32, dp=1, limit=100 * GiB, grad_accum=4)
    assert (got.micro_batch, got.grad_accum, compiled) == (8, 4, [8])
    with pytest.raises(memory.MemoryPlanError, match="train.grad_accum=0"):
        memory.plan(compile_at, batch=32, dp=1, limit=5 * GiB, grad_accum=2)
    with pytest.raises(ValueError, match="data-parallel size 4"):
        memory.plan(compile_at, batch=32, dp=4, limit=None, grad_accum=16)
    got, _ = memory.plan(compile_at, batch=32, dp=1, limit=100 * GiB, grad_accum=3)
    assert (got.micro_batch, got.grad_accum, got.last) == (11, 3, 10)

    def refused(micro):  # the TPU compiler refuses a program over the HBM when compiling it
        raise RuntimeError(
            "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
            "temporaries (106.38G) exceeds available HBM (95.74G)."
        )

    with pytest.raises(memory.MemoryPlanError, match="106.38 GiB per device"):  # remat goes on
        memory.plan(refused, batch=32, dp=1, limit=95 * GiB, grad_accum=2)


def test_without_a_limit_the_whole_batch_is_one_micro_batch():
    compile_at, compiled = _curve(GiB, GiB)
    got, _ = memory.plan(compile_at, batch=32, dp=1, limit=None)
    assert (got.micro_batch, got.grad_accum, compiled) == (32, 1, [32])


# ---------------------------------------------------------------- accumulation, exactly


def _tiny(vocab=256, arch="hwh"):
    config = base.get_config(f"{arch}_tiny")
    config.seq_len = 32
    config.model.dtype = "float32"
    config.model.la_chunk_size = 16
    config.train.warmup_steps = 1
    return config, model_for_run(config, vocab)


def test_accumulated_steps_equal_full_batch_steps():
    """Three AdamW steps on a batch of 8: whole; as 4 micro-batches of 2; as 3 of 3 (the last
    of 2); and over 2 data-parallel devices as 2 of 6 (the last of 2: each device's 4 rows as 3
    and 1). fp32, CPU: losses agree to 2e-5 relative, every parameter to 1e-4 relative or 1e-5
    absolute (weights of scale 0.02; summation order is the only difference, and Adam's
    normalisation magnifies it in coordinates whose gradients are near zero)."""
    config, cfg = _tiny(arch="transformer")  # the accumulation does not depend on the mixer
    tx, schedule = make_optimizer(run_specs(config, data_files=False).optimizer)
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor")
    )
    graphdef, _, _ = train_state_shardings(cfg, tx, mesh)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, size=(3, 8, 33))
    mask = (rng.random((3, 8, 32)) > 0.2).astype(np.float32)  # unequal tokens per row
    two = jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",)),
        jax.sharding.PartitionSpec("data"),
    )
    runs = {}
    for accum, micro, shards in ((1, None, 1), (4, 2, 1), (3, 3, 1), (2, 6, 2)):
        state = init_train_state(cfg, tx, jnp.int32(0))
        step = jax.jit(
            make_train_step(
                graphdef, tx, schedule, grad_accum=accum, micro_batch=micro, shards=shards
            )
        )
        losses = []
        for i in range(3):
            batch = {
                "inputs": jnp.asarray(tokens[i, :, :-1], jnp.int32),
                "targets": jnp.asarray(tokens[i, :, 1:], jnp.int32),
                "segment_ids": jnp.ones((8, 32), jnp.int32),
                "positions": jnp.broadcast_to(jnp.arange(32, dtype=jnp.int32), (8, 32)),
                "loss_mask": jnp.asarray(mask[i]),
            }
            if shards > 1:
                batch = jax.device_put(batch, two)
            state, m = step(state, batch)
            losses.append(float(m["loss"]))
            assert float(m["tokens"]) == mask[i].sum()
        runs[accum, shards] = (losses, state["params"])
    whole = runs.pop((1, 1))
    for losses, params in runs.values():
        np.testing.assert_allclose(losses, whole[0], rtol=2e-5)
        for a, b in zip(jax.tree.leaves(whole[1]), jax.tree.leaves(params)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)


def test_micro_batches_take_every_row_once_on_its_own_device():
    """``_split_micro``: 10 rows over 2 devices as micro-batches of 4: two of 4 and a last of 2;
    each micro-batch takes half its rows from each device's block of 5, and every row is in
    exactly one micro-batch. A grad_accum that does not match the split is refused."""
    rows = jnp.arange(10)
    head, tail = _split_micro({"x": rows}, 2, 4, 2)
    assert head["x"].tolist() == [[0, 2, 5, 7], [1, 3, 6, 8]] and tail["x"].tolist() == [4, 9]
    head, tail = _split_micro({"x": jnp.arange(8)}, 4, 2, 1)
    assert head["x"].tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]] and tail is None
    step = make_train_step(None, None, None, grad_accum=4, micro_batch=3)
    with pytest.raises(ValueError, match="4 micro-batches of 3 rows cannot split a batch of 8"):
        step({"params": {}}, {"x": jnp.zeros((8, 2))})


# ---------------------------------------------------------------- the trainer's plan


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    path = root / "shakespeare.txt"
    path.write_text(read_text(resolve("tinyshakespeare/input.txt.gz"))[:100_000])
    os.environ["HWH_CACHE_DIR"] = str(root / "cache")
    return path


def _run_config(corpus, **train):
    config, _ = _tiny(arch="transformer")
    config.data.paths = (str(corpus),)
    config.data.sp_vocab_size = 512
    config.data.heldout_fraction = 0.05
    t = config.train
    t.steps, t.batch_size, t.lr = 3, 8, 3e-3
    t.log_every, t.eval_every, t.checkpoint_every, t.eval_sequences = 1, 0, 0, 16
    t.mesh = (1, 1, 1)
    config.eval.at_end = False
    for k, v in train.items():
        setattr(t, k, v)
    return config


def test_the_trainer_plans_micro_batches_under_a_memory_limit(corpus, tmp_path, capsys):
    """No limit known (CPU): the batch of 8 in one micro-batch. A limit the whole batch's step
    just misses: the trainer accumulates smaller micro-batches, says so in its plan line,
    progress line, memory_plan.json (which a resumed start reads) and summary, and trains the
    same losses."""
    whole = train_and_evaluate(_run_config(corpus), tmp_path / "whole")
    plan = whole.summary["memory_plan"]
    assert (plan["micro_batch"], plan["grad_accum"], plan["how"]) == (8, 1, "no limit known")
    limit_gb = plan["step_bytes"] / GiB / memory.HEADROOM * 0.999
    capsys.readouterr()
    split = train_and_evaluate(_run_config(corpus, device_memory_gb=limit_gb), tmp_path / "split")
    out = capsys.readouterr().out
    plan = split.summary["memory_plan"]
    assert plan["how"] == "planned" and plan["grad_accum"] > 1
    assert plan["micro_batch"] * plan["grad_accum"] == 8
    assert f"memory plan: micro-batch {plan['micro_batch']} x {plan['grad_accum']}" in out
    assert (
        f"| {plan['micro_batch']}x{plan['grad_accum']} {memory.size(plan['step_bytes'])} |" in out
    )
    saved = json.loads((tmp_path / "split" / memory.PLAN_FILE).read_text())
    assert saved["micro_batch"] == plan["micro_batch"]
    for s, loss in whole.losses.items():
        assert abs(split.losses[s] - loss) <= 2e-5 * abs(loss), (s, split.losses[s], loss)
    assert memory.remembered(tmp_path / "split", saved["key"]) == plan["micro_batch"]
    # launch.plan's planner (pod_plan.plan_step, which plans a TPU slice on its compile-only
    # devices) given these devices and this limit: the same probes, the same choice
    from hwh_jax.training import pod_plan

    config = _run_config(corpus, device_memory_gb=limit_gb)
    config.model.vocab_size = 512  # the trainer's, from its tokenizer
    got, _, _, _, _ = pod_plan.plan_step(
        config, jax.devices(), platform="cpu", limit=memory.device_limit(limit_gb)
    )
    assert got.to_json() == {k: v for k, v in plan.items() if k != "key"}


def test_a_plan_is_remembered_under_its_key_only(tmp_path):
    got = memory.Plan(4, 8, 3 * GiB, 10 * GiB, "planned", ((1, GiB), (4, 3 * GiB)))
    key = memory.plan_key({"d_model": 64}, 32, 32, "cpu")
    assert memory.remembered(tmp_path, key) is None
    memory.remember(tmp_path, key, got)
    assert memory.remembered(tmp_path, key) == 4
    assert memory.remembered(tmp_path, memory.plan_key({"d_model": 128}, 32, 32, "cpu")) is None
    (tmp_path / memory.PLAN_FILE).write_text("{not json")
    assert memory.remembered(tmp_path, key) is None


def test_an_impossible_config_stops_before_its_first_step(corpus, tmp_path):
    with pytest.raises(memory.MemoryPlanError) as e:
        train_and_evaluate(_run_config(corpus, device_memory_gb=0.001), tmp_path / "w")
    msg = str(e.value)
    assert "does not fit even at 1 sequence(s) per device" in msg
    assert f"train.mesh=(1,{jax.device_count()},1)" in msg and "seq_len=32" in msg
    assert " MiB per device" in msg
    assert not (tmp_path / "w" / "checkpoints").exists() or not any(
        (tmp_path / "w" / "checkpoints").iterdir()
    )


def test_a_compiler_out_of_memory_is_a_probe_over_the_limit():
    """The TPU compiler refuses a program over the HBM at compile time: the planner reads the
    bytes it says the program needs; any other error is not its business."""
    from hwh_jax.training.memory import compile_oom_bytes

    e = RuntimeError(
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required "
        "for HLO temporaries (37.14T) exceeds available HBM (15.75G)."
    )
    assert compile_oom_bytes(e) == int(37.14 * 2**40)
    assert compile_oom_bytes(RuntimeError("RESOURCE_EXHAUSTED: out of memory")) == 2**62
    assert compile_oom_bytes(ValueError("shapes do not match")) is None
    sflag = "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space sflag."
    assert compile_oom_bytes(RuntimeError(sflag)) is None  # a core's sync flags, not the HBM
