"""Shared defaults of every run config. ``get_config("hwh_tiny")`` or ``"arch=hwh,size=tiny"``.

Only launchers and the trainer read this ConfigDict; the model gets a frozen ModelConfig built
by ``hwh_jax.models.variants.model_config_from_dict(config.model)``.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from hwh_jax.data.pipeline import DataSpec
from hwh_jax.eval.suite import EvalSpec
from hwh_jax.layers.config import KERNEL_SETTINGS, SETTINGS_SET_HERE
from hwh_jax.models.variants import ARCHS, SIZES
from hwh_jax.training.optimizer import OptimizerSpec


def settings_config(cls, skip=()) -> ml_collections.ConfigDict:
    """A kernel op's settings dataclass as a ConfigDict of its defaults (``skip``: fields set
    elsewhere); a setting whose default is None (chosen from the shape) takes a typed
    placeholder, so the command line can still set it."""
    c = ml_collections.ConfigDict()
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.default is None:
            kind = int if "int" in str(f.type) else str
            c[f.name] = ml_collections.config_dict.placeholder(kind)
        else:
            c[f.name] = f.default
    return c


def parse_arg(arg: str | None) -> tuple[str, str]:
    """'hwh_tiny' or 'arch=hwh,size=tiny' -> ('hwh', 'tiny')."""
    if not arg:
        return "hwh", "tiny"
    if "=" in arg:
        kv = dict(part.split("=", 1) for part in arg.split(","))
        return kv.get("arch", "hwh"), kv.get("size", "tiny")
    arch, _, size = arg.rpartition("_")
    if arch not in ARCHS or size not in SIZES:
        raise ValueError(
            f"config variant {arg!r} is not <arch>_<size> with arch in {ARCHS} "
            f"and size in {list(SIZES)}"
        )
    return arch, size


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arch, size = parse_arg(arg)
    config = ml_collections.ConfigDict()
    config.seed = 0  # init and data-order seed
    config.seq_len = 2048 if size != "tiny" else 256  # training context length
    m = config.model = ml_collections.ConfigDict()
    m.arch = arch  # one of hwh_jax.models.ARCHS
    m.size = size  # row of hwh_jax.models.SIZES
    m.fa_share = 0.1875  # hwh*: FA heads / all heads (< 0.25)
    m.counts = ""  # hwh*: per-layer FA counts "0,2,3,0" or a JSON path
    m.ratio = (1, 3)  # layerwise/swa: FA layers : other layers
    m.window = 0  # swa: local window (0 = the size's default)
    m.vocab_size = 0  # 0 = the size's default (tokenizer must fit in it)
    m.q_per_kv = 1  # GQA group size of FA heads
    m.qk_norm = False  # Qwen3-style q/k RMSNorm in FA heads
    m.rope_theta = 10000.0
    m.rope_pairing = "half"  # "half" (HF) or "interleaved"
    m.dtype = "float32" if size == "tiny" else "bfloat16"  # compute dtype (params stay fp32);
    #                                        tiny runs on CPUs, where bf16 is emulated and slow
    # each kernel op's settings (impl and launch settings, kernels_pallas/<op>/settings.py):
    # model.attention, decode_attention, gdn, decay, hgrn, conv, norm, matmul, e.g.
    # --config.model.gdn.impl=chunk_reference --config.model.gdn.wy_apply=triton
    for name, cls in KERNEL_SETTINGS.items():
        m[name] = settings_config(cls, skip=SETTINGS_SET_HERE[name])
    m.la_chunk_size = 64
    m.la_kind = "gdn"  # the linear heads: gdn | deltanet | lightning |
    #                                        retnet | mamba2 | gla | hgrn | hgrn2 (docs/models.md)
    m.la_short_conv = False  # a short convolution on q, k, v of lightning, retnet,
    #                                        gla, hgrn2 (the kinds without one; docs/models.md)
    m.remat = "none"  # what a block keeps for the backward pass: none | save_dots |
    #                                        save_dots_except_mlp | save_qkv_proj | minimal |
    #                                        full | offload (hwh_jax/layers/remat.py)
    m.kernel_platform = ""  # kernels chosen for "cpu" | "gpu" | "tpu"; "" = this
    #                                        process's backend (set it to export for another)
    # data: every field of hwh_jax.data.pipeline.DataSpec (its defaults and comments)
    d = config.data = ml_collections.ConfigDict(dataclasses.asdict(DataSpec()))
    if size != "tiny":
        d.tokenizer = "gpt2"

    t = config.train = ml_collections.ConfigDict()
    t.steps = 250 if size == "tiny" else OptimizerSpec.total_steps
    t.stop_at_step = 0  # stop (with a checkpoint) before `steps`; 0 = no
    t.accept_changes = ""  # bound keys (model.*, data.*, seq_len, seed,
    #                                        train.batch_size) this start may change in a
    #                                        workdir made by another config: "a.b,c" or "all"
    t.batch_size = 16 if size == "tiny" else 256  # global batch, sequences
    t.grad_accum = 0  # micro-batches per step; 0 = the fewest that fit
    #                                        the devices (hwh_jax/training/memory.py)
    t.device_memory_gb = 0.0  # memory a device may use; 0 = what it reports
    t.loss_impl = "auto"  # the LM head + loss as one op (layers.loss.head_loss)
    #                                        with softmax_xent impl "auto" | "reference" |
    #                                        "pallas"; or "unfused" (autodiff through the logits)
    # the optimizer: every field of hwh_jax.training.optimizer.OptimizerSpec but total_steps
    # (train.steps), with its defaults and comments there
    for f in dataclasses.fields(OptimizerSpec):
        if f.name != "total_steps":
            t[f.name] = f.default
    if size == "tiny":
        t.lr, t.warmup_steps = 3e-3, 25
    t.z_loss = 0.0  # e.g. 1e-4 for PaLM's z-loss
    t.document_mask = True  # attend / recur within documents only (False: across them)
    t.mesh = (-1, 1, 1)  # (data, fsdp, tensor); -1 = the remaining devices
    t.allow_unsplit_heads = False  # run a tensor axis that some layers' head counts
    #                                        cannot split (refused otherwise: training/preflight.py)
    t.log_every = 25 if size == "tiny" else 50
    t.eval_every = 50 if size == "tiny" else 1000
    t.eval_sequences = 320  # held-out sequences per evaluation, the same rows for every
    #                                        run whatever its batch (data.pipeline.eval_order; 0 = all)
    t.final_eval = True  # held-out evaluation after the last step
    t.checkpoint_every = 100 if size == "tiny" else 1000
    t.checkpoint_minutes = 0.0  # also save when this much wall time passed since
    #                                        the last save (0 = by steps only)
    t.keep_checkpoints = 3
    t.lease_seconds = 120.0  # the workdir's lease goes stale this long after its
    #                                        holder's last heartbeat (0: no lease; lease.py)
    t.async_checkpoints = True  # write checkpoints while training goes on
    t.stop_exit_status = 0  # exit status after a SIGTERM/SIGINT stop with its
    #                                        checkpoint saved; 75 lets a supervisor relaunch
    t.loggers = "tensorboard"  # besides metrics.jsonl: "", "tensorboard", "wandb",
    #                                        or both comma-separated (wandb: the [wandb] extra)
    t.wandb_project = "hwh-jax"  # W&B project; the run id is kept in the workdir
    t.peak_flops = 0.0  # per-device peak for MFU; 0 = from the device kind
    t.profile_at = 0  # trace the steps after this one (0 = never) into
    t.profile_steps = 5  # <workdir>/profile; hwh_jax.profiling.profile sums it

    # The evaluation after training: every field of hwh_jax.eval.EvalSpec (its defaults and
    # comments), plus at_end.
    e = config.eval = ml_collections.ConfigDict(dataclasses.asdict(EvalSpec()))
    e.at_end = size == "tiny"  # evaluate the final model (writes <workdir>/eval)
    if size == "tiny":  # the main job's evaluation: about a minute on a CPU
        e.niah_factors, e.niah_depths, e.ppl_factor = (1, 2), 3, 2
        e.niah_samples = 1  # 9 prompts a length: intervals of +-30 points or more
    config.lock()
    return config
