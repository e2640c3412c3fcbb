"""A training run sized for a TPU slice before anyone rents it: the train step compiled by the
TPU compiler for the slice's compile-only devices (``tpu_slices``), with the mesh, shardings,
kernels and micro-batch planning ``launch.train`` would use there, and what the compiler says
of it.

``plan_train(config, slice)`` builds the step exactly as the trainer does (``run_specs``, the
model's kernels for TPU, ``train_state_shardings``, ``compiled.train_step_compiler``) and lets
``memory.plan`` choose the micro-batch against the chip's HBM, as the trainer does against the
memory a device reports. It returns a JSON-able dict:

- ``memory``: per chip, from the compiled program (arguments, outputs, aliased, temporaries,
  code; ``step_bytes`` as the planner counts it) against the chip's HBM;
- ``plan``: the micro-batch and accumulation chosen, and every micro-batch probed;
- ``cost``: XLA's cost analysis of the chosen program (FLOPs and bytes accessed per chip; a
  loop body, such as the accumulation's, is counted once by XLA);
- ``collectives``: per kind, per step and chip: executions, result bytes and the bytes a chip
  sends under a ring algorithm (``profiling.hlo``: each collective once, loops' trip counts
  applied);
- ``kernels``: the Mosaic (Pallas) kernels by name and count;
- ``estimate``: a roofline step time from the chip's datasheet: compute time is the model's
  FLOPs a step (``flops.flops_per_token``, the formula MFU uses) over the slice's peak; memory
  time is XLA's bytes accessed per chip times the accumulation count over the HBM bandwidth;
  collective time is the bytes a chip sends per step (ring algorithm) over the chip's ICI
  bandwidth. ``step_s_overlapped`` is the largest of the three (everything
  overlaps), ``step_s_serial`` their sum (nothing does); tokens/s and MFU from each. The
  compute is spread evenly over the chips; ``causal_load`` says how much more the last shard of
  a sequence axis computes (``flops.sequence_load``: its causal attention sees the most keys,
  and the shards run in lockstep).

A config that does not fit raises ``memory.MemoryPlanError`` naming the memory needed, the
chip's HBM and the remedies.
"""

from __future__ import annotations

import collections
import dataclasses
import re

import jax
import jax.numpy as jnp

from hwh_jax.layers import remat
from hwh_jax.profiling import hlo
from hwh_jax.training import memory, preflight
from hwh_jax.training import sharding as shd
from hwh_jax.training.compiled import RematCompilers
from hwh_jax.training.export import inference_programs, run_model_config
from hwh_jax.training.flops import flops_per_token, sequence_load
from hwh_jax.training.optimizer import make_optimizer
from hwh_jax.training.specs import run_specs
from hwh_jax.training.state import train_state_shardings
from hwh_jax.training.tpu_slices import Slice, compile_only_devices

BATCH_KEYS = ("inputs", "targets", "segment_ids", "positions", "loss_mask")
_KERNEL = re.compile(r"%([A-Za-z_][\w\-]*?)(?:\.\d+)? = .*custom_call_target=\"tpu_custom_call\"")


def _memory(compiled) -> dict:
    m = compiled.memory_analysis()
    return {
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "aliased": m.alias_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
        "code": m.generated_code_size_in_bytes,
        "step_bytes": memory.step_bytes(compiled),
    }


def _cost(compiled) -> dict:
    c = compiled.cost_analysis()
    c = c[0] if isinstance(c, (list, tuple)) else (c or {})
    return {
        "flops": float(c.get("flops", 0.0)),
        "bytes_accessed": float(c.get("bytes accessed", 0.0)),
    }


def program_summary(compiled) -> dict:
    """Collectives of a compiled TPU program per kind and per run of it (executions, result
    bytes, ring wire bytes a chip sends: ``profiling.hlo``) and its Mosaic kernels by name."""
    text = compiled.as_text()
    kernels = collections.Counter(m.group(1) for m in _KERNEL.finditer(text))
    return {
        "collectives": hlo.summary(hlo.collectives(text)),
        "kernels": dict(sorted(kernels.items())),
    }


def estimate(
    slice_: Slice,
    *,
    model_flops_step: float,
    bytes_step: float,
    collective_bytes_step: float,
    tokens_step: int,
) -> dict:
    """The roofline of the module docstring, per step."""
    chip = slice_.chip
    compute = model_flops_step / (chip.bf16_flops * slice_.chips)
    hbm = bytes_step / chip.hbm_bytes_per_s
    ici = collective_bytes_step / chip.ici_bytes_per_s
    out = {
        "compute_s": compute,
        "hbm_s": hbm,
        "ici_s": ici,
        "step_s_overlapped": max(compute, hbm, ici),
        "step_s_serial": compute + hbm + ici,
    }
    for key in ("overlapped", "serial"):
        t = out[f"step_s_{key}"]
        out[f"tokens_per_s_{key}"] = tokens_step / t if t else None
        out[f"mfu_{key}"] = compute / t if t else None
    return out


def plan_inference(
    config, slice_: Slice, *, batch: int, context: int, serve_mesh: tuple | None = None
) -> dict:
    """The prefill of a ``context // 2``-token prompt and one decode step at a ``context``
    cache for ``batch`` requests, compiled on one chip of ``slice_``, or over the slice served
    by a (data, fsdp, tensor) ``serve_mesh`` (requests over data x fsdp, weights over fsdp and
    tensor as in training): memory per chip against its HBM, kernels, collectives."""
    cfg = run_model_config(config, "tpu")
    devices = compile_only_devices(slice_)
    if serve_mesh:
        mesh = shd.make_mesh(tuple(serve_mesh), devices)
        if batch % shd.data_parallel_size(mesh):
            raise ValueError(
                f"--batch={batch} requests do not split over the serving mesh's "
                f"data x fsdp = {shd.data_parallel_size(mesh)} chips "
                f"(--serve_mesh={','.join(map(str, serve_mesh))})"
            )
        preflight.check_heads(
            cfg,
            dict(mesh.shape),
            allow_unsplit=run_specs(config, data_files=False).train.allow_unsplit_heads,
        )
        programs = inference_programs(cfg, batch=batch, context=context, mesh=mesh)
    else:
        programs = inference_programs(
            cfg,
            batch=batch,
            context=context,
            sharding=jax.sharding.SingleDeviceSharding(devices[0]),
        )
    out = {}
    for name, (fn, args) in programs.items():
        compiled = jax.jit(fn).lower(*args).compile()
        out[name] = {
            "memory": {**_memory(compiled), "hbm": slice_.chip.hbm_bytes},
            "cost": _cost(compiled),
            **program_summary(compiled),
        }
        out[name]["fits"] = out[name]["memory"]["step_bytes"] <= slice_.chip.hbm_bytes
    return {
        "batch": batch,
        "context": context,
        "mesh": dict(mesh.shape) if serve_mesh else None,
        **out,
    }


def plan_step(config, devices, *, platform: str, limit: int | None):
    """The training step of ``config`` planned over ``devices`` against ``limit`` bytes a device
    exactly as ``launch.train`` plans it there (``train_step_compiler`` and
    ``memory.plan_remat``: the remat policies in the trainer's order):
    (plan, compiled step, mesh, model config, compiler options the step needed). ``devices``:
    a slice's compile-only devices (``plan_train``) or this host's (tests compare the
    trainer's plan with this one)."""
    specs = run_specs(config, data_files=False)
    c = specs.train
    cfg = run_model_config(config, platform)
    tx, schedule = make_optimizer(specs.optimizer)
    mesh = shd.make_mesh(c.mesh, devices)
    preflight.check_run(specs, dict(mesh.shape), platform=platform)
    graphdef, abstract_state, state_sh = train_state_shardings(cfg, tx, mesh)
    state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, state_sh
    )
    rows = shd.batch_sharding(mesh)
    shape = (c.batch_size, c.seq_len)
    batch = {
        k: jax.ShapeDtypeStruct(
            shape, jnp.float32 if k == "loss_mask" else jnp.int32, sharding=rows
        )
        for k in BATCH_KEYS
    }

    compile_for = RematCompilers(  # the trainer's: the config's remat policy, then the next
        cfg,
        graphdef,
        tx,
        mesh,
        schedule=schedule,
        state_sh=state_sh,
        state=state,
        batch=batch,
        batch_size=c.batch_size,
        z_loss=c.z_loss,
        document_mask=c.document_mask,
        loss_impl=c.loss_impl,
    )

    chips = len(devices)

    def advice() -> str:
        params = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract_state))
        return (
            f"The parameters and optimizer state alone are {memory.size(params)} before "
            f"sharding (mesh {dict(mesh.shape)} on {chips} chips of "
            f"{memory.size(limit or 0)}). To fit: a larger slice; more of the mesh on fsdp "
            f"(train.mesh=1,{chips},1 shards parameters, optimizer state and "
            f"gradients over every chip); a shorter context (seq_len={c.seq_len}); or a "
            f"smaller model (every remat policy down to model.remat=full was tried)"
        )

    plan, compiled = memory.plan_remat(
        compile_for,
        remat.fallbacks(cfg.remat, platform),
        batch=c.batch_size,
        dp=shd.data_parallel_size(mesh),
        limit=limit,
        grad_accum=c.grad_accum,
        advice=advice,
    )
    if plan.remat != remat.ALIASES.get(cfg.remat, cfg.remat):
        cfg = cfg.replace(remat=plan.remat)
    return plan, compiled, mesh, cfg, dict(compile_for.options)


def plan_train(config, slice_: Slice, *, keep_hlo: bool = False) -> dict:
    """The plan of ``config``'s training step on ``slice_`` (module docstring); with
    ``keep_hlo`` the compiled program's HLO text under ``"hlo"``."""
    c = run_specs(config, data_files=False).train
    hbm = slice_.chip.hbm_bytes
    plan, compiled, mesh, cfg, options = plan_step(
        config, compile_only_devices(slice_), platform="tpu", limit=hbm
    )
    program = program_summary(compiled)
    cost = _cost(compiled)
    tokens = c.tokens_per_step
    n = plan.grad_accum
    wire_bytes = sum(v["wire_bytes"] for v in program["collectives"].values())
    out = {
        "topology": slice_.name,
        "grid": "x".join(map(str, slice_.grid)),
        "chips": slice_.chips,
        "chip": dataclasses.asdict(slice_.chip),
        "mesh": dict(mesh.shape),
        "arch": cfg.arch,
        "seq_len": c.seq_len,
        "batch_size": c.batch_size,
        "tokens_per_step": tokens,
        "memory": {**_memory(compiled), "hbm": hbm},
        "fits": plan.step_bytes <= hbm,
        "plan": plan.to_json(),
        "compiler_options": options,  # beyond the launcher's flags (compiled.compile_lowered)
        "cost": cost,
        **program,
        "estimate": estimate(
            slice_,
            model_flops_step=flops_per_token(cfg, c.seq_len) * tokens,
            bytes_step=cost["bytes_accessed"] * n,
            collective_bytes_step=wire_bytes,
            tokens_step=tokens,
        ),
        "causal_load": sequence_load(cfg, c.seq_len, dict(mesh.shape).get("sequence", 1)),
    }
    if keep_hlo:
        out["hlo"] = compiled.as_text()
    return out
