r"""Tokens/s and MFU of the project's jitted training step (forward, backward, AdamW) on one device.

  python bench/train_step.py --archs transformer gdn layerwise hwh --sizes small 380m \
      --contexts 2048 8192 32768 --tokens_per_step 131072 --out $OUT/train_step.jsonl

For every (arch, size, context): the step of ``hwh_jax.training.steps.make_train_step`` (the one
``launch.train`` runs, bf16 compute, fp32 params and AdamW state) on random tokens
(Zipf-distributed as in text unless ``--tokens uniform``; ``sample_tokens``); the batch is
tokens_per_step / context, halved until it fits in memory (``--tokens_per_step`` is the starting
point, OOMs are caught and reported). After 2 warm-ups: ``step_latency_ms``, the median of --steps
steps each waited for (``block_until_ready``), and ``step_ms``, the median over 3 runs of --steps
steps dispatched back to back and waited for once, divided by --steps: the rate ``launch.train``
sees (it waits only at its log lines), which tokens/s and MFU use. The two differ by the host's
work per step (dispatch, launching the step's kernels), which overlaps the device's only when steps
are queued. Each row also keeps every waited step (``waited_ms``), every run's rate
(``step_ms_runs``), how long each call of a run took the host to return (``call_ms``: a call
returns once the device is near the previous step's end, so a long one is a host pause) and
every garbage collection while steps ran (``gc``; Python's collector is frozen after the warm-ups
as ``launch.train`` does, unless ``--gc auto``). MFU = flops_per_token
(``hwh_jax/training/flops.py``: 6 x matmul params + attention + GDN chunk FLOPs) x tokens/s / the
device's dense bf16 peak. Memory: the compiled step's own buffers
(arguments + outputs + temporaries - donated aliases, from ``memory_analysis()``); the device's
peak counter is process-wide (the largest step so far), so it is only recorded as
``process_peak_mem_gib``. The kernels the dispatchers chose are printed with each row.
``--profile DIR`` traces --profile_steps (3) more steps per row and prints where their device time
goes: by category (GDN kernels, attention, matmuls, copies, fusions), the top kernels with the
operation and source line each came from, how much of the step the device was busy, the first
kernel to the last, and which kernels the idle gaps follow (``hwh_jax.profiling.profile``).
``--micro_batch M`` runs each step's batch as micro-batches of M sequences with their gradients
accumulated (the last holding the rows left), the step ``launch.train`` runs when its memory
plan splits the batch. The batch is the same every step, so the loss (``first_loss`` after the
first step, ``loss`` after the last) is not a training curve: a model that memorises fast learns
these independent tokens by heart and goes below ``batch_unigram_entropy`` (the entropy of the
batch's token frequencies, the lowest a causal model can reach without memorising); the script
warns when it does (docs/benchmarks.md, "Loss on a fixed batch"). ``--hlo DIR`` writes each row's compiled program (XLA's fusions and the
kernels' operands, to read what a fusion in the profile does).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from _bench import emit, is_oom, parse_overrides, print_device, write_jsonl
from flax import nnx

import kernels_pallas
from hwh_jax.models import HybridLM, model_config
from hwh_jax.models.params import count_params
from hwh_jax.profiling import host_gc, profile
from hwh_jax.training.flops import flops_per_token, peak_flops
from hwh_jax.training.memory import accumulation
from hwh_jax.training.optimizer import OptimizerSpec, make_optimizer
from hwh_jax.training.steps import make_train_step


def sample_tokens(rng, vocab: int, shape, dist: str) -> np.ndarray:
    """Token ids: ``zipf``, rank r drawn with probability ~ 1/r as words are in text (the
    embedding's backward scatter-adds every occurrence into its token's row, and how often rows
    collide sets its time: tens of milliseconds of a 380m step on real text when done in bf16,
    next to nothing on ``uniform`` ids)."""
    if dist == "uniform":
        return rng.integers(0, vocab, shape).astype(np.int32)
    if dist != "zipf":
        raise ValueError(f"unknown token distribution {dist!r}; known: zipf, uniform")
    p = 1.0 / np.arange(1, vocab + 1)
    return rng.choice(vocab, size=shape, p=p / p.sum()).astype(np.int32)


def unigram_entropy(targets: np.ndarray) -> float:
    """The empirical entropy (nats) of the token ids in ``targets``: the loss a model that
    knows only their frequencies reaches; below it, the model predicts the independent random
    tokens of the fixed batch from their context, which it can only have memorised."""
    counts = np.bincount(targets.ravel())
    p = counts[counts > 0] / targets.size
    return float(-(p * np.log(p)).sum())


def packed_documents(rng, B: int, T: int, mean: int):
    """(segment ids, positions) [B, T] of rows packed with documents of ``mean`` tokens on
    average (lengths geometric, as a packed corpus's roughly are); 0: one document a row."""
    if mean <= 0:
        return np.ones((B, T), np.int32), np.tile(np.arange(T, dtype=np.int32), (B, 1))
    starts = rng.random((B, T)) < 1.0 / mean
    starts[:, 0] = True
    seg = np.cumsum(starts, axis=1).astype(np.int32)
    idx = np.where(starts, np.arange(T), 0)
    pos = np.arange(T) - np.maximum.accumulate(idx, axis=1)
    return seg, pos.astype(np.int32)


def time_step(
    arch,
    size,
    T,
    B,
    steps,
    dtype,
    vocab_size=0,
    profile_dir="",
    overrides=None,
    profile_top=20,
    hlo_dir="",
    profile_steps=3,
    gc_mode="freeze",
    tokens="zipf",
    loss_impl="auto",
    micro_batch=0,
    documents=0,
):
    overrides = {**(overrides or {}), **({"vocab_size": vocab_size} if vocab_size else {})}
    cfg = model_config(arch, size, dtype=dtype, **overrides)
    graphdef, params = nnx.split(HybridLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    tx, schedule = make_optimizer(OptimizerSpec(lr=1e-4, warmup_steps=1, total_steps=100))
    state = {
        "params": params,
        "opt_state": tx.init(params),
        "step": jnp.int32(0),
        "rng": jnp.zeros((2,), jnp.uint32),
        "bad_step": jnp.int32(-1),
    }
    rng = np.random.default_rng(0)
    tok = sample_tokens(rng, cfg.vocab_size, (B, T + 1), tokens)
    seg, pos = packed_documents(rng, B, T, documents)
    batch = jax.device_put(
        {
            "inputs": tok[:, :-1],
            "targets": tok[:, 1:],
            "segment_ids": seg,
            "positions": pos,
            "loss_mask": np.ones((B, T), np.float32),
        }
    )
    t0 = time.time()
    grad_accum, _ = accumulation(B, micro_batch or B)
    step = (
        jax.jit(
            make_train_step(
                graphdef,
                tx,
                schedule,
                loss_impl=loss_impl,
                grad_accum=grad_accum,
                micro_batch=micro_batch or B,
                document_mask=documents > 0,
            ),
            donate_argnums=0,
        )
        .lower(state, batch)
        .compile()
    )
    state, m = step(state, batch)
    first_loss = float(m["loss"])
    compile_s = time.time() - t0
    hlo = step.as_text() if hlo_dir or profile_dir else None  # MBs of text: printed once
    if hlo_dir:
        Path(hlo_dir).mkdir(parents=True, exist_ok=True)
        with gzip.open(Path(hlo_dir) / f"{arch}_{size}_{T}.hlo.txt.gz", "wt") as f:
            f.write(hlo)
    state, m = step(state, batch)
    jax.block_until_ready(m["loss"])
    frozen = host_gc.freeze() if gc_mode == "freeze" else 0
    with host_gc.GcPauses() as pauses:  # every collection while steps run, to the row
        times = []
        for _ in range(steps):  # one at a time: the latency of a step, host included
            t = time.perf_counter()
            state, m = step(state, batch)
            jax.block_until_ready(m["loss"])
            times.append(time.perf_counter() - t)
        runs, calls = [], []
        for _ in range(3):  # back to back, as launch.train dispatches them
            t = time.perf_counter()
            marks = [t]
            for _ in range(steps):
                state, m = step(state, batch)
                marks.append(time.perf_counter())
            jax.block_until_ready(m["loss"])
            runs.append((time.perf_counter() - t) / steps)
            calls.append([round(1e3 * (b - a), 2) for a, b in zip(marks, marks[1:])])
        if profile_dir:
            with profile.capture(profile_dir):
                for _ in range(profile_steps):
                    state, m = step(state, batch)
                jax.block_until_ready(m["loss"])
    print(f"gc ({gc_mode}, {frozen} objects frozen): {pauses.summary()}", flush=True)
    latency_ms = 1e3 * statistics.median(times)
    ms = 1e3 * statistics.median(runs)
    prof = None
    if profile_dir:
        prof = profile.summarize(profile_dir, steps=profile_steps, top=profile_top, hlo_text=hlo)
        print(profile.format_summary(prof, ms), flush=True)
    tps = B * T / ms * 1e3
    floor = unigram_entropy(tok[:, 1:])
    last_loss = float(m["loss"])
    if last_loss < floor - 0.5:  # the fixed batch learnt by heart (docs/benchmarks.md)
        print(
            f"warning: {arch} {size} T={T} B={B}: loss {first_loss:.3f} -> {last_loss:.3f} after "
            f"{2 + 4 * steps + (profile_steps if profile_dir else 0)} steps on one fixed batch, "
            f"below its unigram entropy {floor:.3f}: the model memorised the batch (a leak of "
            f"future tokens would also do this: bench/memorize.py tells them apart)",
            flush=True,
        )
    kind = jax.devices()[0].device_kind
    peak = peak_flops(kind)
    fpt = flops_per_token(cfg, T)
    mem = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")  # process-wide
    ma = step.memory_analysis()  # this step's own buffers, from the compiled program
    step_bytes = (
        (
            ma.argument_size_in_bytes
            + ma.output_size_in_bytes
            + ma.temp_size_in_bytes
            - ma.alias_size_in_bytes
        )
        if ma is not None
        else None
    )
    return {
        "arch": arch,
        "size": size,
        "T": T,
        "documents": documents,
        "B": B,
        **({"micro_batch": micro_batch, "grad_accum": grad_accum} if grad_accum > 1 else {}),
        "vocab_size": cfg.vocab_size,
        **({"overrides": overrides} if overrides else {}),
        "loss_impl": loss_impl,
        "params": count_params(cfg),
        "tokens": tokens,
        "step_ms": ms,
        "step_latency_ms": latency_ms,
        "tokens_per_s": tps,
        "step_ms_runs": [round(1e3 * r, 2) for r in runs],
        "waited_ms": [round(1e3 * t, 2) for t in times],
        "call_ms": calls,
        "gc": {
            "mode": gc_mode,
            "frozen": frozen,
            "collections": pauses.summary(),
            "pauses_over_5ms": [[g, round(ms, 1)] for g, ms in pauses.events if ms > 5],
        },
        "flops_per_token": fpt,
        "mfu": fpt * tps / peak if peak else None,
        "compile_s": compile_s,
        "loss": last_loss,
        "first_loss": first_loss,
        "batch_unigram_entropy": floor,
        "step_mem_gib": step_bytes / 2**30 if step_bytes else None,
        "process_peak_mem_gib": mem / 2**30 if mem else None,
        "kernels": kernels_pallas.chosen(),
        **({"profile": prof} if prof else {}),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", nargs="+", default=["transformer", "gdn", "layerwise", "hwh"])
    ap.add_argument("--sizes", nargs="+", default=["small", "380m"])
    ap.add_argument("--contexts", nargs="+", type=int, default=[2048, 8192, 32768])
    ap.add_argument("--tokens_per_step", type=int, default=131072)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--vocab_size",
        type=int,
        default=0,
        help="0: the size's default (GPT-2's 50,257); configs/experiment.py: 4096",
    )
    ap.add_argument(
        "--profile",
        default="",
        help="directory: trace --profile_steps steps per row (dispatched back to "
        "back) and print their device time by kernel",
    )
    ap.add_argument("--profile_steps", type=int, default=3)
    ap.add_argument(
        "--tokens",
        choices=("zipf", "uniform"),
        default="zipf",
        help="token ids of the random batch (sample_tokens)",
    )
    ap.add_argument(
        "--gc",
        choices=("auto", "freeze"),
        default="freeze",
        help="freeze: hwh_jax.profiling.host_gc.freeze() after the warm-up steps, as "
        "launch.train does (auto: Python's collector as it comes)",
    )
    ap.add_argument(
        "--loss_impl",
        default="auto",
        help="train.loss_impl: unfused, or the LM head + loss op's softmax_xent impl",
    )
    ap.add_argument(
        "--profile_top",
        type=int,
        default=20,
        help="with --profile: how many kernels to list (the rest count in categories)",
    )
    ap.add_argument(
        "--hlo",
        default="",
        help="directory: write each row's compiled program, {arch}_{size}_{T}.hlo.txt.gz",
    )
    ap.add_argument(
        "--override",
        nargs="*",
        default=[],
        metavar="FIELD=VALUE",
        help="ModelConfig fields, e.g. gdn.impl=chunk_reference (Python literals)",
    )
    ap.add_argument(
        "--micro_batch",
        type=int,
        default=0,
        help="run each step's batch as micro-batches of this many sequences, "
        "gradients accumulated, as launch.train's memory plan does (0: one)",
    )
    ap.add_argument(
        "--documents",
        type=int,
        default=0,
        help="rows packed with documents of this many tokens on average, kept apart "
        "(train.document_mask=True); 0: one document a row, no masks",
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    try:
        overrides = parse_overrides(args.override)
    except ValueError as e:
        ap.error(str(e))
    print_device()
    rows = []
    for size in args.sizes:
        for T in args.contexts:
            for arch in args.archs:
                B = max(args.tokens_per_step // T, 1)
                while True:
                    try:
                        prof = f"{args.profile}/{arch}_{size}_{T}" if args.profile else ""
                        row = time_step(
                            arch,
                            size,
                            T,
                            B,
                            args.steps,
                            args.dtype,
                            args.vocab_size,
                            prof,
                            overrides,
                            args.profile_top,
                            args.hlo,
                            args.profile_steps,
                            args.gc,
                            args.tokens,
                            args.loss_impl,
                            args.micro_batch,
                            args.documents,
                        )
                        break
                    except Exception as e:  # XLA reports OOM as several types
                        if not is_oom(e):
                            raise
                        print(
                            json.dumps({"arch": arch, "size": size, "T": T, "B": B, "oom": True}),
                            flush=True,
                        )
                        if B == 1:
                            row = {"arch": arch, "size": size, "T": T, "B": 0, "oom": True}
                            break
                        B //= 2
                emit(rows, row)
                write_jsonl(args.out, rows)  # after every row: a cut run keeps its rows
    print(
        f"\n{'size':6s} {'T':>6s} {'arch':12s} {'B':>4s} {'step ms':>9s} {'waited':>8s} "
        f"{'tok/s':>10s} {'MFU':>6s} {'mem GiB':>8s} {'loss first -> last':>18s} {'H1':>5s}"
    )
    for r in rows:
        if r.get("oom"):
            print(f"{r['size']:6s} {r['T']:6d} {r['arch']:12s}  OOM at batch 1")
            continue
        mfu = f"{r['mfu']:.1%}" if r["mfu"] else "n/a"
        mem = f"{r['step_mem_gib']:.1f}" if r["step_mem_gib"] else "n/a"
        print(
            f"{r['size']:6s} {r['T']:6d} {r['arch']:12s} {r['B']:4d} {r['step_ms']:9.1f} "
            f"{r['step_latency_ms']:8.1f} {r['tokens_per_s']:10,.0f} {mfu:>6s} {mem:>8s} "
            f"{r['first_loss']:8.3f} -> {r['loss']:6.3f} {r['batch_unigram_entropy']:5.2f}"
        )


if __name__ == "__main__":
    main()
