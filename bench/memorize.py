r"""Memorisation or leak: the training step on one fixed batch of independent random tokens
against a fresh random batch every step, per architecture.

  python bench/memorize.py --archs transformer gdn hwh --size small --seq_len 512 --batch 4 --steps 80 \
      --out $OUT/memorize.jsonl

Tokens are drawn independently (Zipf, as ``train_step.py`` draws them), so a causal model cannot
predict them: trained on a *fresh* batch each step its loss stays near the unigram entropy of
the distribution. Trained on one *fixed* batch it can fall below that only by memorising the
batch, and a model that memorises scores a batch it has never seen at the unigram level again
(``unseen_loss``). A model that sees its targets (a leak: a future token reaches an earlier
position) keeps a low loss on fresh and unseen batches alike. The step is
``make_train_step``'s (AdamW, warmup 1, lr --lr as ``train_step.py``), fp32 on the CPU, bf16 with
the GPU kernels on a GPU.

Each row also has what a memoriser can exploit: the empirical conditional entropy of a target
given the n tokens before it within the fixed batch (``cond_entropy``, n = 0, 1, 2): at n = 1
it is near 0 when almost every (previous token, token) pair in the batch is unique, i.e. a model
that can tell the previous token from the current one can look up the answer.
"""

from __future__ import annotations

import argparse
import collections
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from _bench import emit, parse_overrides, print_device, write_jsonl
from flax import nnx
from train_step import sample_tokens

from hwh_jax.models import HybridLM, model_config
from hwh_jax.training.optimizer import OptimizerSpec, make_optimizer
from hwh_jax.training.steps import make_train_step


def cond_entropy(tok: np.ndarray, n: int) -> float:
    """Empirical H(x_t | x_{t-n..t-1}) in nats over the rows of ``tok`` [B, T+1] (targets are
    positions 1..T, as the step's)."""
    counts = collections.Counter()
    ctx = collections.Counter()
    for row in tok:
        for t in range(max(n, 1), len(row)):
            key = tuple(row[t - n : t])
            counts[key + (row[t],)] += 1
            ctx[key] += 1
    total = sum(counts.values())
    return -sum(c / total * math.log(c / ctx[k[:-1]]) for k, c in counts.items())


def recency(model, tokens, near: int = 4) -> dict:
    """How much the last position's final hidden state depends on each earlier token at
    initialisation: the norm of its Jacobian with respect to each earlier position's embedding,
    as shares of their sum over all earlier positions: ``last_{near}`` (the ``near`` tokens
    before it) and ``first_half`` (the first half of the row). A model whose mixing starts
    local describes a position by its last few tokens, which in a batch of random tokens is
    almost a unique key; one that starts uniform describes it by the token and a blur."""
    positions = jnp.arange(tokens.shape[1])[None]

    def last_hidden(x):
        delta = None
        for block in model.blocks:
            x, delta = block.residual(x, delta, positions, None)
        h = model.final_norm.add(x, delta)[1]
        return h[0, -1].astype(jnp.float32)

    x = model.embed_tokens(tokens).astype(jnp.float32)
    jac = jax.jit(jax.jacrev(last_hidden))(x)  # [d, 1, T, d]; one program, not op by op
    norms = np.asarray(jnp.sqrt((jac**2).sum(axis=(0, 3)))[0])[:-1]  # earlier positions
    total = norms.sum()
    return {
        f"last_{near}": float(norms[-near:].sum() / total),
        "first_half": float(norms[: len(norms) // 2].sum() / total),
    }


def zipf_entropy(vocab: int) -> float:
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    return float(-(p * np.log(p)).sum())


def batch_of(tok):
    B, T1 = tok.shape
    T = T1 - 1
    return jax.device_put(
        {
            "inputs": tok[:, :-1],
            "targets": tok[:, 1:],
            "segment_ids": np.ones((B, T), np.int32),
            "positions": np.tile(np.arange(T, dtype=np.int32), (B, 1)),
            "loss_mask": np.ones((B, T), np.float32),
        }
    )


def run(
    arch,
    size,
    T,
    B,
    steps,
    lr,
    dtype,
    overrides,
    seed=0,
    label=None,
    cache=None,
    with_recency=True,
    modes=("fixed", "fresh"),
):
    """One row: ``steps`` steps on a fixed batch, then from the same initialisation on a
    fresh batch each step (``modes``: which of the two, in that order). ``cache``: a dict
    keeping the jitted step across seeds (one compile per architecture and shape)."""
    cfg = model_config(arch, size, dtype=dtype, **overrides)
    graphdef, params = nnx.split(HybridLM(cfg, rngs=nnx.Rngs(seed)), nnx.Param)
    tx, schedule = make_optimizer(OptimizerSpec(lr=lr, warmup_steps=1, total_steps=max(steps, 100)))
    cache = {} if cache is None else cache
    key = (label or arch, size, T, B, lr, steps)
    if key not in cache:  # the losses on the unseen and fixed batch come from the step too
        cache[key] = jax.jit(make_train_step(graphdef, tx, schedule), donate_argnums=0)
    step = cache[key]
    rng = np.random.default_rng(1000 + seed)
    fixed = sample_tokens(rng, cfg.vocab_size, (B, T + 1), "zipf")
    unseen = batch_of(sample_tokens(rng, cfg.vocab_size, (B, T + 1), "zipf"))
    row = {
        "arch": label or arch,
        "size": size,
        "T": T,
        "B": B,
        "lr": lr,
        "seed": seed,
        "dtype": dtype,
        **({"overrides": overrides} if overrides else {}),
        "zipf_entropy": zipf_entropy(cfg.vocab_size),
        "cond_entropy": {n: cond_entropy(fixed, n) for n in (0, 1, 2)},
    }
    if with_recency:
        row["recency_at_init"] = recency(
            nnx.merge(graphdef, params), jnp.asarray(fixed[:1, : min(T, 256)])
        )
    t0 = time.time()
    fb = batch_of(fixed)
    for mode in modes:
        state = {
            "params": jax.tree.map(jnp.copy, params),
            "opt_state": tx.init(params),
            "step": jnp.int32(0),
            "rng": jnp.zeros((2,), jnp.uint32),
            "bad_step": jnp.int32(-1),
        }
        losses = []
        for i in range(steps):
            b = (
                fb
                if mode == "fixed"
                else batch_of(sample_tokens(rng, cfg.vocab_size, (B, T + 1), "zipf"))
            )
            state, m = step(state, b)
            losses.append(round(float(m["loss"]), 4))
            if i % 10 == 0 or i == steps - 1:
                print(f"  {label or arch} B={B} seed={seed} {mode} step {i + 1}: {losses[-1]}")
        row[f"{mode}_losses"] = losses
        # the trained weights on a batch never seen, and on the fixed batch: the loss a step
        # reports is taken before its update (one program, no second compile)
        _, m = step(jax.tree.map(jnp.copy, state), unseen)
        row[f"{mode}_unseen_loss"] = float(m["loss"])
        _, m = step(state, fb)
        row[f"{mode}_seen_loss"] = float(m["loss"])
    row["seconds"] = round(time.time() - t0, 1)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", nargs="+", default=["transformer", "gdn", "hwh"])
    ap.add_argument("--size", default="small")
    ap.add_argument("--seq_len", type=int, default=512)
    ap.add_argument("--batch", type=int, nargs="+", default=[4])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--dtype", default="")
    ap.add_argument(
        "--variant",
        nargs="*",
        default=[],
        metavar="LABEL:ARCH:FIELD=VALUE,...",
        help="extra rows: an architecture with ModelConfig overrides, e.g. "
        "hwh_conv1:hwh:conv_size=1",
    )
    ap.add_argument(
        "--skip_recency",
        action="store_true",
        help="do not measure each model's locality at init (a Jacobian: minutes at 380m)",
    )
    ap.add_argument(
        "--modes",
        nargs="+",
        choices=["fixed", "fresh"],
        default=["fixed", "fresh"],
        help="which runs, in this order (fresh first where device time is short)",
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    dtype = args.dtype or ("float32" if jax.default_backend() == "cpu" else "bfloat16")
    runs = [(a, a, {}) for a in args.archs]
    for v in args.variant:
        label, arch, spec = v.split(":", 2)
        runs.append((label, arch, parse_overrides(spec.split(","))))
    print_device()
    rows, cache = [], {}
    for B in args.batch:
        for seed in args.seeds:
            for label, arch, ov in runs:
                emit(
                    rows,
                    run(
                        arch,
                        args.size,
                        args.seq_len,
                        B,
                        args.steps,
                        args.lr,
                        dtype,
                        ov,
                        seed,
                        label,
                        cache,
                        not args.skip_recency,
                        args.modes,
                    ),
                )
                write_jsonl(args.out, rows)
    print(
        f"\n{'arch':14s} {'B':>3s} {'seed':>4s} {'fixed last':>10s} {'unseen':>7s} "
        f"{'fresh last':>10s} {'unseen':>7s}  H(x|prev)  init: last 4 / first half"
    )

    def last(r, mode):
        if f"{mode}_losses" not in r:
            return f"{'-':>10s} {'-':>7s}"
        return f"{r[f'{mode}_losses'][-1]:10.3f} {r[f'{mode}_unseen_loss']:7.3f}"

    for r in rows:
        print(
            f"{r['arch']:14s} {r['B']:3d} {r['seed']:4d} {last(r, 'fixed')} {last(r, 'fresh')}"
            f"  {r['cond_entropy'][1]:9.3f}  "
            + (
                f"{r['recency_at_init']['last_4']:.2f} / {r['recency_at_init']['first_half']:.2f}"
                if "recency_at_init" in r
                else "-"
            )
        )


if __name__ == "__main__":
    main()
