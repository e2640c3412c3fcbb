"""A run's programs lowered for a platform this host need not have (``jax.export``).

``export_train_step(config, platform=, mesh=)`` lowers the training step exactly as
``launch.train`` builds it (``train_state_shardings``, ``make_train_step``, ``jit_step``: the
kernels per device shard, the batch over the data axes) with the model's kernels chosen for
``platform`` (``model.kernel_platform``). ``export_inference_steps`` lowers a prompt's prefill
and one decode step. Lowering runs the platform's own checks (Pallas' Mosaic lowering for TPU,
Triton's for GPU) and needs only as many devices of any kind as the mesh has: on a CPU,
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` gives N. ``summarize`` reads what a
lowered program holds: its size, its custom calls (the Pallas kernels by name, cuDNN's
attention) and its input shardings.
"""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
from flax import nnx
from jax import export as jax_export

import kernels_pallas
from hwh_jax.models.lm import HybridLM
from hwh_jax.models.variants import SIZES
from hwh_jax.training import sharding as shd
from hwh_jax.training.optimizer import make_optimizer
from hwh_jax.training.specs import model_for_run, run_specs
from hwh_jax.training.state import jit_step, train_state_shardings
from hwh_jax.training.steps import make_train_step

PLATFORMS = {"tpu": "tpu", "gpu": "cuda", "cpu": "cpu"}  # ours -> jax.export's names
# Custom calls jax.export keeps no compatibility promise for: allowed here, since the programs
# are lowered to be inspected and run by this JAX version, not stored for later ones.
UNVERSIONED = ("__gpu$xla.gpu.triton", "cu_threefry2x32")


def _export(fn, platform: str):
    checks = [jax_export.DisabledSafetyCheck.custom_call(t) for t in UNVERSIONED]
    return jax_export.export(fn, platforms=[PLATFORMS[platform]], disabled_checks=checks)


def run_model_config(config, platform: str):
    """The run's ModelConfig with its kernels chosen for ``platform``; the vocabulary is the
    config's or, where the tokenizer would set it, the size's default."""
    if platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {tuple(PLATFORMS)}, got {platform!r}")
    config = config.copy_and_resolve_references()
    config.model.kernel_platform = platform
    vocab = config.model.vocab_size or SIZES[config.model.size].vocab_size
    return model_for_run(config, vocab)


def export_train_step(
    config, *, platform: str, mesh: tuple[int, int, int], devices=None
) -> jax_export.Exported:
    """The training step of ``config`` lowered for ``platform`` over a (data, fsdp, tensor)
    mesh of that many devices (``devices``, default all of this host's). ``train.grad_accum``
    0 (the trainer plans it from the devices' memory) lowers the batch as one micro-batch."""
    specs = run_specs(config, data_files=False)
    cfg = run_model_config(config, platform)
    c = specs.train
    tx, schedule = make_optimizer(specs.optimizer)
    mesh = shd.make_mesh(tuple(mesh), devices)
    graphdef, abstract_state, state_sh = train_state_shardings(cfg, tx, mesh)
    step = jit_step(
        make_train_step(
            graphdef,
            tx,
            schedule,
            grad_accum=c.grad_accum or 1,
            z_loss=c.z_loss,
            document_mask=c.document_mask,
            loss_impl=c.loss_impl,
        ),
        mesh,
        state_sh,
        out_shardings=(state_sh, None),
        donate_argnums=(0,),
    )
    state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, state_sh
    )
    rows = shd.batch_sharding(mesh)
    shape = (c.batch_size, c.seq_len)
    batch = {
        k: jax.ShapeDtypeStruct(
            shape, jnp.float32 if k == "loss_mask" else jnp.int32, sharding=rows
        )
        for k in ("inputs", "targets", "segment_ids", "positions", "loss_mask")
    }
    return _export(step, platform)(state, batch)


def inference_programs(
    cfg, *, batch: int, context: int, prompt: int | None = None, sharding=None, mesh=None
) -> dict[str, tuple]:
    """{"prefill": (fn, args), "decode": (fn, args)}: a prompt of ``prompt`` tokens (default
    ``context // 2``) into an empty cache of ``context`` slots, and one token over it, with
    abstract arguments (parameters in the compute dtype as ``Generator`` holds them). Placed
    on one device by ``sharding``, or served over a (data, fsdp, tensor) ``mesh``: the
    requests (rows of tokens and cache) over data x fsdp, the weights by their logical names
    as in training (fsdp, tensor), the functions tracing their kernels per shard."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0))))
    weight_sh = shd.state_shardings(state, mesh) if mesh is not None else None
    state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape,
            cfg.compute_dtype if x.ndim >= 2 and jnp.issubdtype(x.dtype, jnp.floating) else x.dtype,
        ),
        state,
    )
    cache = jax.eval_shape(lambda s: nnx.merge(graphdef, s).init_cache(batch, context), state)
    prompt = prompt or context // 2

    def prefill(state, tokens, cache):
        logits, cache = nnx.merge(graphdef, state).extend(tokens, cache, fresh=True, last_only=True)
        return logits[:, -1], cache

    def decode(state, token, cache):
        logits, cache = nnx.merge(graphdef, state).extend(token[:, None], cache)
        return logits[:, 0], cache

    tokens = jax.ShapeDtypeStruct((batch, prompt), jnp.int32)
    token = jax.ShapeDtypeStruct((batch,), jnp.int32)
    args = {"prefill": (state, tokens, cache), "decode": (state, token, cache)}
    if sharding is not None:
        place = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
        args = {k: jax.tree.map(place, v) for k, v in args.items()}
    if mesh is not None:
        rows = (
            shd.batch_sharding(mesh)
            if batch % shd.data_parallel_size(mesh) == 0
            else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        )

        def by_rows(x):  # a request's arrays: rows over the batch axes
            row_sh = (
                rows
                if x.ndim and x.shape[0] == batch
                else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            )
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=row_sh)

        weights = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, weight_sh
        )
        args = {k: (weights, *jax.tree.map(by_rows, v[1:])) for k, v in args.items()}
        prefill, decode = (kernels_pallas.kernel_mesh(mesh)(f) for f in (prefill, decode))
    return {"prefill": (prefill, args["prefill"]), "decode": (decode, args["decode"])}


def export_inference_steps(
    cfg, *, platform: str, batch: int, context: int, prompt: int | None = None
) -> dict[str, jax_export.Exported]:
    """The programs of ``inference_programs`` lowered for ``platform`` on one device."""
    cfg = cfg.replace(kernel_platform=platform)
    return {
        name: _export(jax.jit(fn), platform)(*args)
        for name, (fn, args) in inference_programs(
            cfg, batch=batch, context=context, prompt=prompt
        ).items()
    }


_CALL = re.compile(r"stablehlo\.custom_call @([\w$.\-]+)\(")
_KERNEL = re.compile(
    r'kernel_name = "([^"]+)"'  # Mosaic (TPU)
    r'|name = "([\w\-]+)", num_stages'
)  # Triton (GPU)
_MESH = re.compile(r"sdy\.mesh @\w+ = <\[([^\]]*)\]>")
_ARG = re.compile(
    r"%arg\d+: tensor<[^>]*> \{[^}]*?sdy\.sharding = #sdy\.sharding<@\w+, (\[[^>]*\])"
)


def summarize(exported: jax_export.Exported) -> dict:
    """Size, custom calls (the Pallas kernels by name, Mosaic or Triton) and the mesh and input
    shardings of a lowered program."""
    text = exported.mlir_module()
    main = text[text.find("func.func public @main") :]
    main = main[: main.find("\n")]
    mesh = _MESH.search(text)
    shardings = collections.Counter(_ARG.findall(main)) or collections.Counter(
        str(s) for s in exported.in_shardings_hlo
    )
    return {
        "platforms": list(exported.platforms),
        "devices": exported.nr_devices,
        "module_bytes": len(text),
        "mesh": mesh.group(1) if mesh else None,
        "custom_calls": dict(collections.Counter(_CALL.findall(text))),
        "kernels": dict(collections.Counter(a or b for a, b in _KERNEL.findall(text))),
        "input_shardings": dict(shardings.most_common()),
    }
