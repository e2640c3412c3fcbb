r"""Causality on the device: change the tokens after a position p and require nothing before p
to move, for every architecture, size, batch and length, in every path the project runs, at
initialisation and after training; then the kernels alone.

  python bench/causality.py --out $OUT/causality.jsonl                # the whole matrix
  python bench/causality.py --sizes small --archs hwh transformer --kernels ''   # a part

A model's check (``model_rows``): tokens ``a`` [B, T] and ``b``, equal but in row 0 from
position p on (p = T/2 + 37: no multiple of any chunk or block size). Then, with the model's
own kernels (the dispatchers' choices on this device, bf16 compute):
- ``plain``: the residual stream after the embedding and after every block, and the final
  hidden state, as ``HybridLM.hidden`` computes them;
- ``train_fwd``: the same under ``jax.vjp`` (the primal the training step differentiates:
  custom_vjp forward rules included);
- ``grad``: the gradient of the step's loss (the fused LM head + loss, ``train_loss``) over the
  positions whose targets did not change (row 0 before p - 1, all other rows): a backward that
  moved information from later positions would change it (batch 1 and the smallest batch at
  the 380m and 1b4 sizes, where a batch-8 backward at 8K would not fit);
- ``prefill``: the logits of ``extend`` over a fresh cache (the inference path).
Each state is compared through a fixed random projection to 16 values a position (a change
survives it with probability 1), in fp32. Required: in row 0 before p and in every position
of the other rows, the largest change between ``a`` and ``b`` is at most that between runs of
``a`` (``rerun``, the largest of two reruns; 0 where the device is deterministic). A gradient
leaf may also move by 2^-12 of its own largest entry (1/32 of bf16's spacing at 1): a sum
whose order depends on the data (the embedding's scatter-add, XLA's atomics) rounds
differently when a later token changes, without carrying it; ``exact`` says whether any leaf
moved more than its rerun level. ``--deterministic`` asks XLA for deterministic GPU ops
(``--xla_gpu_exclude_nondeterministic_ops``), so that the rerun level is 0. XLA's GEMM autotuning
is off unless ``--autotune`` (``--xla_gpu_autotune_level=0``; each row's ``xla_flags``): it
picks the fastest of equivalent algorithms, which a check does not need. ``moved_after_p``
shows the change does reach the later positions. ``--trained_steps`` (50) steps of AdamW at
lr 1e-3 on fresh random batches (1 x 2,048) then repeat every check on the trained weights (a
path whose weights are zero at init cannot leak at init).

The kernels alone (``kernel_rows``): short_conv, gated_delta_rule with each ``wy_apply``,
decay_attention (per head and per key), gated_recurrence, and attention at 1, 2, 3, 5 heads
(HwH's FA head counts, no positional encoding) with the dispatchers' choices, forward and
gradient of a prefix loss.

Each path is its own program, run one after another (a device holds one path's buffers at a
time; a gradient check holds two gradients, not four). ``--paths fwd`` (the three forward
paths) or ``grad`` checks one kind alone: less to compile where the other was checked already.
Each row says where the time went, to plan a run within a time limit: ``compile_s`` (the
model's programs, once), ``train_s`` (its training, once) and ``check_s`` (the row's own runs
and comparisons).

``--jobs N`` checks the models of a size in N processes at once (each compiles on its own
cores and takes 0.9/N of the GPU's memory), the kernels first in this one; the rows of all go
to ``--out``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _bench import device_info, emit, print_device, write_jsonl
from flax import nnx
from train_step import sample_tokens

import kernels_pallas
from hwh_jax.layers import heads
from hwh_jax.models import HybridLM, model_config
from hwh_jax.training.steps import train_loss
from kernels_pallas import (
    AttentionSettings,
    DecaySettings,
    GDNSettings,
    attention,
    decay_attention,
    gated_delta_rule,
    gated_recurrence,
    short_conv,
)

PROJ = 16
START = time.time()
DETERMINISTIC = "--xla_gpu_exclude_nondeterministic_ops=true"
NO_AUTOTUNE = "--xla_gpu_autotune_level=0"  # XLA's default GEMMs: a check, not a timing
GRAD_FLOOR = 2.0**-12  # of a leaf's largest entry: rounding, not a carried token
ARCHS = ["transformer", "gdn", "layerwise", "swa", "hwh"]  # the matrix: these, then HwH with
KINDS = [k for k in heads.names() if k != "gdn"]  # each other linear kind
SIZES = ["small", "380m", "1b4"]


def split_p(T: int) -> int:
    return T // 2 + 37


def arch_list(archs, kinds, only=None):
    """(label, arch, overrides): the named architectures, then HwH with each zoo kind; those
    labelled in ``only`` where given."""
    out = [(a, a, {}) for a in archs]
    out += [(f"hwh_{k}", "hwh", {"la_kind": k}) for k in kinds]
    return [m for m in out if only is None or m[0] in only]


def token_pair(vocab, B, T, seed):
    rng = np.random.default_rng(seed)
    a = sample_tokens(rng, vocab, (B, T + 1), "zipf")
    b = a.copy()
    p = split_p(T)
    b[0, p:] = sample_tokens(rng, vocab, (T + 1 - p,), "zipf")
    return a, b


def _project(x, key):
    """[..., d] -> [..., PROJ] fp32 by a fixed Gaussian projection."""
    r = jax.random.normal(key, (x.shape[-1], PROJ), jnp.float32)
    return x.astype(jnp.float32) @ r


def _streams(model, tokens):
    """[L + 2, B, T, PROJ]: the stream after the embedding and after every block, then the
    final hidden state (``HybridLM.hidden``'s loop, every state kept)."""
    key = jax.random.key(7)
    positions = jnp.arange(tokens.shape[1])[None]
    x = model.embed_positions(model.embed_tokens(tokens), positions)
    delta, out = None, [_project(x, key)]
    for block in model.blocks:
        x, delta = block.residual(x, delta, positions, None)
        out.append(_project(x + delta, key))
    out.append(_project(model.final_norm.add(x, delta)[1], key))
    return jnp.stack(out)


PATHS = {"fwd": ("plain", "train_fwd", "prefill"), "grad": ("grad",)}  # a check's programs


def model_paths(graphdef):
    """{path: f(params, batch)}: the paths the module docstring lists, each its own program
    (the three forward ones in one program asked 41.6 GiB at once for a 1.4B at 8 x 8,192: the
    prefill's cache and logits beside the other two's activations)."""

    def plain(params, batch):
        return _streams(nnx.merge(graphdef, params), batch["inputs"])

    def train_fwd(params, batch):
        return jax.vjp(lambda p: plain(p, batch), params)[0]

    def grad(params, batch):
        return jax.grad(lambda p: train_loss(graphdef, p, batch)[0])(params)

    def prefill(params, batch):
        model = nnx.merge(graphdef, params)
        B, T = batch["inputs"].shape
        logits, _ = model.extend(batch["inputs"], model.init_cache(B, T), fresh=True)
        return _project(logits, jax.random.key(8))

    return {"plain": plain, "train_fwd": train_fwd, "prefill": prefill, "grad": grad}


def batch_of(tok, loss_mask=None):
    B, T = tok.shape[0], tok.shape[1] - 1
    return {
        "inputs": jnp.asarray(tok[:, :-1]),
        "targets": jnp.asarray(tok[:, 1:]),
        "segment_ids": jnp.ones((B, T), jnp.int32),
        "positions": jnp.tile(jnp.arange(T, dtype=jnp.int32), (B, 1)),
        "loss_mask": jnp.ones((B, T), jnp.float32) if loss_mask is None else loss_mask,
    }


def prefix_mask(B, T):
    """1 where the target did not change: row 0 before p - 1 (targets are the next inputs),
    every position of the other rows."""
    m = np.ones((B, T), np.float32)
    m[0, split_p(T) - 1 :] = 0
    return jnp.asarray(m)


def compare(x_a, x_b, x_a2, T, x_a3=None):
    """Largest |change| (fp32) in the unchanged region, after p in row 0, and between reruns
    (``x_a2``, ``x_a3``: ``x_a`` again); states [..., B, T, P] (leading layer axis allowed)."""
    p = split_p(T)
    d = np.abs(np.asarray(x_a, np.float32) - np.asarray(x_b, np.float32))
    d = d.reshape(-1, *d.shape[-3:])  # [layers, B, T, P]
    a = np.asarray(x_a, np.float32)
    reruns = [x for x in (x_a2, x_a3) if x is not None]
    rerun = max(float(np.abs(a - np.asarray(x, np.float32)).max()) for x in reruns)
    before = np.concatenate([d[:, 0, :p].ravel(), d[:, 1:].ravel()])
    per_layer = [
        float(max(d[l, 0, :p].max(), d[l, 1:].max() if d.shape[1] > 1 else 0.0))
        for l in range(d.shape[0])
    ]
    return {
        "before_p": float(before.max()),
        "moved_after_p": float(d[:, 0, p:].max()),
        "rerun": rerun,
        "scale": float(np.abs(np.asarray(x_a, np.float32)).max()),
        "worst_layer": int(np.argmax(per_layer)),
        "causal": bool(before.max() <= rerun),
    }


@jax.jit
def _max_abs_diff(x, y):
    return jnp.abs(x - y).max()  # one fused reduction: no |x - y| the size of the leaf


def leaf_diffs(g_a, g_b) -> list[float]:
    """The largest |g_a - g_b| of each leaf (gradient pytrees)."""
    return [float(_max_abs_diff(x, y)) for x, y in zip(jax.tree.leaves(g_a), jax.tree.leaves(g_b))]


def compare_grads(g_a, diffs, rerun_diffs):
    """As ``compare`` for gradients (pytrees): ``diffs``, ``leaf_diffs`` of ``g_a`` and the
    changed input's gradient, against ``rerun_diffs`` (``g_a``'s against reruns of its input):
    the largest change over the leaves, with the leaf it is in and that leaf's own largest value
    (``leaf_scale``). Taking differences, not gradients, lets a check hold two gradients at once."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(g_a)]
    la = jax.tree.leaves(g_a)
    leaf_rerun = [max(r[i] for r in rerun_diffs) for i in range(len(la))]
    scales = [float(_max_abs_diff(x, 0.0)) for x in la]
    # a leaf's change over what it may move: its rerun level or the rounding floor
    excess = [d / max(r, GRAD_FLOOR * s, 1e-30) for d, r, s in zip(diffs, leaf_rerun, scales)]
    worst = int(np.argmax(excess))
    rerun = max(leaf_rerun)
    return {
        "before_p": diffs[worst],
        "rerun": rerun,
        "scale": max(scales),
        "worst_leaf": paths[worst],
        "leaf_scale": scales[worst],
        "leaf_rerun": leaf_rerun[worst],
        "exact": bool(all(d <= r for d, r in zip(diffs, leaf_rerun))),
        "causal": bool(excess[worst] <= 1.0),
    }


def compile_all(fns, params, shapes, threads):
    """{(path, B, T): compiled} for every path and shape, compiled on ``threads`` threads (XLA
    compiles outside the GIL)."""
    pshape = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)

    lowered = {}
    for B, T, paths in shapes:  # tracing stays on this thread (nnx's graph contexts)
        b = jax.eval_shape(lambda: batch_of(np.zeros((B, T + 1), np.int32)))
        for path in paths:
            lowered[(path, B, T)] = jax.jit(fns[path]).lower(pshape, b)
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        done = ex.map(lambda item: (item[0], item[1].compile()), lowered.items())
        return dict(done)


def model_rows(
    label,
    arch,
    size,
    overrides,
    batches,
    lengths,
    trained_steps,
    threads,
    seed,
    checks=("fwd", "grad"),
    stages=("init", "trained"),
):
    cfg = model_config(arch, size, dtype="bfloat16", remat="full", **overrides)
    graphdef, params = nnx.split(HybridLM(cfg, rngs=nnx.Rngs(seed)), nnx.Param)
    fns = model_paths(graphdef)
    big = size in ("380m", "1b4")
    shapes = []
    for T in lengths:
        for B in batches:
            paths = list(PATHS["fwd"]) if "fwd" in checks else []  # each a program
            if "grad" in checks and (not big or B == min(batches)):
                paths += PATHS["grad"]
            if paths:
                shapes.append((B, T, paths))
    # the training's gradient (1 x 2,048), compiled beside the checks where they lack it
    train_only = "trained" in stages and not any(
        B == 1 and T == 2048 and "grad" in ps for B, T, ps in shapes
    )
    t0 = time.time()
    compiled = compile_all(fns, params, shapes + [(1, 2048, ["grad"])] * train_only, threads)
    compile_s = time.time() - t0
    train_s = 0.0
    for stage in stage_order(stages, trained_steps):
        if stage == "trained":
            t0 = time.time()
            host = jax.device_get(
                train(compiled[("grad", 1, 2048)], params, cfg.vocab_size, trained_steps, seed)
            )
            # back onto a device the training's buffers no longer fragment (a 1.4B's trained
            # 8 x 8,192 forward found no 18.4 GiB block where its initial one had)
            params = None
            params = jax.device_put(host)
            train_s = time.time() - t0
        for B, T, paths in shapes:
            t0 = time.time()
            a, b = token_pair(cfg.vocab_size, B, T, seed=B * 100003 + T)
            mask = prefix_mask(B, T)
            ba, bb = batch_of(a, mask), batch_of(b, mask)
            row = {
                "model": label,
                "arch": arch,
                "size": size,
                "stage": stage,
                "B": B,
                "T": T,
                "p": split_p(T),
                **({"overrides": overrides} if overrides else {}),
            }
            for path in paths:
                f = compiled[(path, B, T)]
                try:  # out of memory at one shape (runs or comparisons): said in its row
                    if path == "grad":  # two gradients held at a time (a 1.4B's are 5.6 GB)
                        xa = f(params, ba)
                        diffs = leaf_diffs(xa, f(params, bb))
                        reruns = [leaf_diffs(xa, f(params, ba)) for _ in range(2)]
                        row["grad"] = compare_grads(xa, diffs, reruns)
                    else:  # two reruns: the rerun level is the larger change
                        xa, xb, xa2 = f(params, ba), f(params, bb), f(params, ba)
                        row[path] = compare(xa, xb, xa2, T, f(params, ba))
                except jax.errors.JaxRuntimeError as e:  # each path's error, none overwritten
                    err = f"{path}: {type(e).__name__}: {str(e)[:300]}"
                    row["error"] = f"{row['error']}; {err}" if "error" in row else err
                xa = xb = xa2 = None  # the device buffers go before the next program
            checked = [k for k in ("plain", "train_fwd", "prefill", "grad") if k in row]
            row["causal"] = "error" not in row and all(row[k]["causal"] for k in checked)
            row["kernels"] = kernels_pallas.chosen()
            row["compile_s"] = round(compile_s, 1)  # the model's programs, once
            row["train_s"] = round(train_s, 1)  # its training steps, once (0 at init)
            row["check_s"] = round(time.time() - t0, 1)  # this row's runs and comparisons
            row["xla_flags"] = os.environ.get("XLA_FLAGS", "")
            yield {**row, **device_info()}  # each row's provenance, kept when rows are merged


def stage_order(stages, trained_steps: int) -> list[str]:
    """The stages to check, initialisation first whatever the order asked (the trained stage
    changes the parameters in place of the initial ones)."""
    if "trained" in stages and not trained_steps:
        raise ValueError("--stages trained needs --trained_steps > 0 (got 0)")
    return [s for s in ("init", "trained") if s in stages]


def train(grad_fn, params, vocab, steps, seed):
    """``steps`` AdamW steps (lr 1e-3) on fresh random batches of 1 x 2,048, with the compiled
    gradient of the loss over every position. Each update donates the parameters and the
    optimizer's state (a 1.4B's training then holds four fp32 copies of its weights, 22 GB, not
    six): ``params`` is consumed."""
    tx = optax.adamw(1e-3, b2=0.95, weight_decay=0.1)

    @functools.partial(jax.jit, donate_argnums=(1, 2))
    def update(g, opt, p):
        u, opt = tx.update(g, opt, p)
        return optax.apply_updates(p, u), opt

    opt = tx.init(params)
    rng = np.random.default_rng(seed + 1)
    for _ in range(steps):
        g = grad_fn(params, batch_of(sample_tokens(rng, vocab, (1, 2049), "zipf")))
        params, opt = update(g, opt, params)
    return params


def kernel_rows(B, T, seed=0):
    """The kernels alone at [B, T], bf16, the dispatchers' choices (module docstring)."""
    p = split_p(T)
    H, K, V, D = 4, 128, 128, 512

    def maker(*shapes):  # inputs of a case from a key: (dtype, transform) per input
        def make(key):
            ks = jax.random.split(key, len(shapes))
            return [
                f(jax.random.normal(k, s, jnp.float32)).astype(dt)
                for k, (s, dt, f) in zip(ks, shapes)
            ]

        return make

    bf, f32, ident = jnp.bfloat16, jnp.float32, lambda x: x
    unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    logsig = lambda x: jax.nn.log_sigmoid(x + 3.0)
    qkv = [((B, T, H, K), bf, ident), ((B, T, H, K), bf, unit), ((B, T, H, V), bf, ident)]
    cases = {}
    w = jax.random.normal(jax.random.key(5), (4, H * K), jnp.float32).astype(bf)
    cases["short_conv"] = (
        lambda x: short_conv(x, w, heads=H, normalize=True),
        maker(((B, T, H * K), bf, ident)),
    )
    gdn_in = maker(*qkv, ((B, T, H), f32, logsig), ((B, T, H), f32, jax.nn.sigmoid))
    for wy in ("triton", "mosaic"):
        s = GDNSettings(wy_apply=wy)
        cases[f"gated_delta_rule/{wy}"] = (
            lambda q, k, v, g, beta, s=s: gated_delta_rule(q, k, v, g, beta, settings=s)[0],
            gdn_in,
        )
    decay = lambda q, k, v, g: decay_attention(q, k, v, g, settings=DecaySettings())[0]
    cases["decay_attention/per_head"] = (decay, maker(*qkv, ((B, T, H), f32, logsig)))
    cases["decay_attention/per_key"] = (decay, maker(*qkv, ((B, T, H, K), f32, logsig)))
    cases["gated_recurrence"] = (
        lambda a, x: gated_recurrence(a, x)[0],
        maker(((B, T, D), bf, lambda x: jax.nn.sigmoid(x + 2)), ((B, T, D), bf, ident)),
    )
    for h in (1, 2, 3, 5):
        cases[f"attention/{h}_heads_nope"] = (
            lambda q, k, v: attention(q, k, v, settings=AttentionSettings()),
            maker(*[((B, T, h, 64), bf, ident)] * 3),
        )
    # a control the check must flag: attention without the causal mask
    cases["control/attention_not_causal"] = (
        lambda q, k, v: attention(q, k, v, causal=False, settings=AttentionSettings()),
        maker(*[((B, T, 2, 64), bf, ident)] * 3),
    )
    rows = []
    for name, (fn, make) in cases.items():
        args = make(jax.random.key(seed))
        other = make(jax.random.key(seed + 1))  # row 0 from p on taken from other inputs
        changed = [x.at[0, p:].set(y[0, p:]) for x, y in zip(args, other)]

        def prefix_loss(*xs):
            o = fn(*xs).astype(jnp.float32)
            return (o[0, :p] ** 2).sum() + (o[1:] ** 2).sum()

        fwd = jax.jit(fn)
        gr = jax.jit(jax.grad(prefix_loss, argnums=tuple(range(len(args)))))
        try:
            oa, ob, oa2 = fwd(*args), fwd(*changed), fwd(*args)
            flat = lambda x: x.reshape(B, T, -1)
            row = {
                "kernel": name,
                "B": B,
                "T": T,
                "p": p,
                "fwd": compare(flat(oa), flat(ob), flat(oa2), T),
            }
            ga, gb, ga2 = gr(*args), gr(*changed), gr(*args)
            # gradients of inputs before p (row 0) and of other rows must not move
            row["grad"] = compare(
                jnp.concatenate([x.reshape(B, T, -1).astype(jnp.float32) for x in ga], -1),
                jnp.concatenate([x.reshape(B, T, -1).astype(jnp.float32) for x in gb], -1),
                jnp.concatenate([x.reshape(B, T, -1).astype(jnp.float32) for x in ga2], -1),
                T,
            )
            # and the gradient of every input after p (which the loss does not read) is 0
            row["grad"]["after_p"] = max(float(jnp.abs(x[0, p:]).max()) for x in ga)
            row["causal"] = (
                row["fwd"]["causal"] and row["grad"]["causal"] and row["grad"]["after_p"] == 0
            )
            if name.startswith("control/"):
                row["expect_causal"] = False
        except Exception as e:  # noqa: BLE001  (a kernel that does not take this shape here)
            row = {"kernel": name, "B": B, "T": T, "error": f"{type(e).__name__}: {e}"[:300]}
        row["kernels"] = kernels_pallas.chosen()
        rows.append({**row, **device_info()})
    return rows


def run_jobs(args, size, models):
    """The models of ``size`` checked in ``args.jobs`` processes (this script, its kernels
    off), each with 0.9/jobs of the GPU's memory, each writing its rows beside ``--out`` as it
    goes (kept if this process is stopped); their rows, in the models' order."""
    groups = [models[j :: args.jobs] for j in range(args.jobs)]
    env = dict(
        os.environ,
        XLA_PYTHON_CLIENT_PREALLOCATE="false",
        XLA_PYTHON_CLIENT_MEM_FRACTION=f"{0.9 / args.jobs:.3f}",
    )
    threads = max(1, args.threads // args.jobs)
    procs = []
    for j, group in enumerate(filter(None, groups)):
        out = f"{args.out or 'causality.jsonl'}.{size}.job{j}"
        cmd = [sys.executable, __file__, "--kernels", "--sizes", size, "--jobs", "1"]
        cmd += ["--archs", *args.archs, "--kinds", *args.kinds, "--only", *group]
        cmd += ["--batches", *map(str, args.batches), "--lengths", *map(str, args.lengths)]
        cmd += ["--trained_steps", str(args.trained_steps), "--threads", str(threads)]
        cmd += ["--seed", str(args.seed), "--out", out, "--quiet_device"]
        cmd += ["--stop_after", str(args.stop_after - (time.time() - START))]
        cmd += ["--deterministic"] * args.deterministic + ["--autotune"] * args.autotune
        cmd += ["--attention_impl", args.attention_impl, "--paths", *args.paths]
        cmd += ["--stages", *args.stages]
        procs.append((subprocess.Popen(cmd, env=env), out))
    rows = []
    for proc, out in procs:
        if proc.wait():
            print(f"a job exited with status {proc.returncode}: {proc.args}", flush=True)
        if os.path.exists(out):
            rows += [json.loads(line) for line in open(out)]
            os.remove(out)
    order = {m: i for i, m in enumerate(models)}
    return sorted(rows, key=lambda r: order.get(r["model"], len(order)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", nargs="*", default=ARCHS)
    ap.add_argument(
        "--kinds",
        nargs="*",
        default=KINDS,
        help="HwH with each of these linear-head kinds (model.la_kind)",
    )
    ap.add_argument("--only", nargs="*", default=None, help="these model labels alone")
    ap.add_argument("--sizes", nargs="*", default=SIZES)
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--lengths", nargs="+", type=int, default=[2048, 8192])
    ap.add_argument("--trained_steps", type=int, default=50)
    ap.add_argument(
        "--kernels",
        nargs="*",
        default=["1,2048", "8,8192"],
        help="B,T shapes of the kernels-alone checks ('' for none)",
    )
    ap.add_argument("--jobs", type=int, default=1, help="processes checking models at once")
    ap.add_argument("--threads", type=int, default=8, help="parallel compiles")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--deterministic",
        action="store_true",
        help="XLA's deterministic GPU ops only (the rerun level is then 0)",
    )
    ap.add_argument(
        "--attention_impl",
        default="auto",
        help="the models' attention (model.attention.impl): 'reference' for XLA's, which runs "
        "under --deterministic where cuDNN's attention did not (an H100, JAX 0.11.2); "
        "'blocked' for XLA's by query blocks, whose scores fit at 8 x 8,192",
    )
    ap.add_argument(
        "--stop_after",
        type=float,
        default=float("inf"),
        help="seconds after which no further model is started (a time limit the run must keep)",
    )
    ap.add_argument(
        "--autotune",
        action="store_true",
        help="let XLA autotune its GPU GEMMs while compiling (off by default: the check does "
        "not need the fastest algorithms)",
    )
    ap.add_argument(
        "--paths",
        nargs="+",
        choices=["fwd", "grad"],
        default=["fwd", "grad"],
        help="the models' checks: 'fwd' (plain, train_fwd, prefill) and 'grad'",
    )
    ap.add_argument(
        "--stages",
        nargs="+",
        choices=["init", "trained"],
        default=None,
        help="check at initialisation, after --trained_steps steps, or both (the default; "
        "initialisation alone at --trained_steps 0)",
    )
    ap.add_argument("--quiet_device", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.stages is None:  # both, where there are steps to train
        args.stages = ["init", "trained"] if args.trained_steps else ["init"]
    try:
        args.stages = stage_order(args.stages, args.trained_steps)
    except ValueError as e:
        ap.error(str(e))
    # before JAX starts its backend (the first device use below)
    flags = os.environ.get("XLA_FLAGS", "").split()  # the jobs below inherit them
    flags += [DETERMINISTIC] * args.deterministic + [NO_AUTOTUNE] * (not args.autotune)
    if flags:
        os.environ["XLA_FLAGS"] = " ".join(dict.fromkeys(flags))  # each once, in order
    if args.jobs > 1:
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # the GPU's memory is the jobs'
    if not args.quiet_device:
        print_device()
    rows = []
    for shape in filter(None, args.kernels):
        B, T = map(int, shape.split(","))
        for r in kernel_rows(B, T, args.seed):
            emit(rows, r)
        write_jsonl(args.out, rows)
    for size in args.sizes:
        models = arch_list(args.archs, args.kinds, args.only)
        if args.jobs > 1:
            rows += run_jobs(args, size, [m[0] for m in models])
            write_jsonl(args.out, rows)
            continue
        for label, arch, ov in models:
            if args.attention_impl != "auto":
                ov = {**ov, "attention": {"impl": args.attention_impl}}
            if time.time() - START > args.stop_after:
                print(f"--stop_after {args.stop_after:.0f} s: {label} ({size}) not checked")
                continue
            for r in model_rows(
                label,
                arch,
                size,
                ov,
                args.batches,
                args.lengths,
                args.trained_steps,
                args.threads,
                args.seed,
                args.paths,
                args.stages,
            ):
                emit(rows, r)
                write_jsonl(args.out, rows)  # each row as it comes: kept if the call is cut
    bad = [r for r in rows if r.get("causal") != r.get("expect_causal", True)]
    print(f"\n{len(rows)} rows, {len(rows) - len(bad)} as expected (causal; the controls not)")
    for r in bad:
        keys = ("model", "kernel", "size", "stage", "B", "T", "error")
        print(verdict(r, args.deterministic), {k: r[k] for k in keys if k in r})


def verdict(row, deterministic: bool) -> str:
    """What a row that is not as expected says: a model row whose forward paths are bit-exact
    and whose only failing check is the gradient under XLA's default GPU ops, which are not
    deterministic (atomic sums: a rerun of the same input already moves the gradients), is
    inconclusive, not a leak; ``--deterministic`` decides it."""
    if "error" in row:
        return "NOT CHECKED (an error, e.g. out of memory: run it alone):"
    failing = [k for k in ("plain", "train_fwd", "prefill", "grad") if k in row]
    failing = [k for k in failing if not row[k]["causal"]]
    if failing == ["grad"] and not deterministic and "model" in row:
        g = row["grad"]
        return (
            f"INCONCLUSIVE (forward paths bit-exact; a gradient leaf moved {g['before_p']:.3g}, "
            f"reruns of one input differ by up to {g['rerun']:.3g} under XLA's default GPU ops: "
            f"run with --deterministic):"
        )
    return "NOT AS EXPECTED:"


if __name__ == "__main__":
    main()
