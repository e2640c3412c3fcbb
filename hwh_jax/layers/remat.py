"""Named rematerialisation policies: which activations a block keeps for the backward pass and
which it recomputes (``model.remat``), as MaxText names them.

  none                  keep everything (no recomputation; the most memory)
  save_dots             keep every matrix product's output, recompute the element-wise rest
  save_dots_except_mlp  keep the attention and linear heads' projections (``qkv_proj``) and the
                        mixer's output projection (``out_proj``), recompute the MLP
  save_qkv_proj         keep only the input projections of the heads
  minimal               keep the products by weights (no batch dimension), recompute the rest
  full                  keep each block's input only, recompute the whole block ("block", the
                        earlier name, is the same)
  offload               as save_dots_except_mlp, the kept tensors moved to host memory
                        (GPUs and TPUs; not on a CPU, where host memory is device memory)

The names tag tensors with ``checkpoint_name`` (an identity outside a rematerialised
function): ``qkv_proj`` on every input projection of a mixer, ``out_proj`` on its output
projection. Memory falls and recomputation grows roughly down the list (none to full); the
memory planner tries them in ``PLANNER_ORDER`` (hwh_jax/training/memory.py)."""

from __future__ import annotations

import jax
from jax.ad_checkpoint import checkpoint_name

QKV, OUT = "qkv_proj", "out_proj"
POLICIES = (
    "none",
    "save_dots",
    "save_dots_except_mlp",
    "save_qkv_proj",
    "minimal",
    "full",
    "offload",
)
ALIASES = {"block": "full"}  # an earlier name
# what the planner tries, least recomputation first, before it declares a batch impossible:
# each step keeps less and recomputes more (offload last: it costs host bandwidth)
PLANNER_ORDER = ("none", "save_dots", "save_dots_except_mlp", "save_qkv_proj", "full", "offload")


def tag(x, name: str):
    """``x`` named for the policies (identity unless rematerialised)."""
    return checkpoint_name(x, name)


def wrap(fn, name: str, remat, platform: str = ""):
    """``fn`` rematerialised by ``remat`` (``nnx.remat``) under policy ``name``; itself for
    "none". ``platform``: what the program is compiled for ("" = the default backend)."""
    name = ALIASES.get(name, name)
    if name == "none":
        return fn
    if name == "offload" and (platform or jax.default_backend()) == "cpu":
        raise ValueError(
            "model.remat='offload' moves the kept activations to host memory, which on a CPU "
            "is the device's own: choose model.remat='full' (or another of "
            f"{[p for p in POLICIES if p != 'offload']})"
        )
    return remat(fn, policy=policy(name))


def policy(name: str):
    """The ``jax.checkpoint`` policy of ``name`` (None: jax.checkpoint's own, which keeps
    nothing but the function's inputs: "full")."""
    name = ALIASES.get(name, name)
    cp = jax.checkpoint_policies
    if name in ("none", "full"):
        return None
    if name == "save_dots":
        return cp.dots_saveable
    if name == "save_dots_except_mlp":
        return cp.save_only_these_names(QKV, OUT)
    if name == "save_qkv_proj":
        return cp.save_only_these_names(QKV)
    if name == "minimal":
        return cp.dots_with_no_batch_dims_saveable
    if name == "offload":
        return cp.save_and_offload_only_these_names(
            names_which_can_be_saved=[],
            names_which_can_be_offloaded=[QKV, OUT],
            offload_src="device",
            offload_dst="pinned_host",
        )
    raise ValueError(f"model.remat={name!r} is not one of {list(POLICIES)}")


def fallbacks(name: str, platform: str) -> tuple[str, ...]:
    """The policies the memory planner tries for a config that names ``name``, in order:
    ``name`` itself, then each of ``PLANNER_ORDER`` after it (offload not on a CPU). A policy
    outside that order (minimal) is followed by full."""
    name = ALIASES.get(name, name)
    order = [p for p in PLANNER_ORDER if platform != "cpu" or p != "offload"]
    if name in order:
        return tuple(order[order.index(name) :])
    later = order[order.index("full") :]
    return (name, *later)
