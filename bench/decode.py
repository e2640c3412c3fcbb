r"""Prefill time, per-token decode latency and decode-cache memory, per architecture and context.

  python bench/decode.py --archs transformer gdn layerwise hwh --size 380m \
      --contexts 2048 8192 32768 65536 --batches 1 32 --out $OUT/decode.jsonl

For every (arch, context, batch): a random prompt of ``context - decode_steps`` tokens is
prefilled in chunks of --prefill_chunk (default 0: the whole prompt at once, as ``Generator``
prefills) through ``Generator``'s own prefill step, compiled once per chunk shape (the first
chunk ``fresh``: its FA heads attend over the chunk through the training attention, later ones
over the cache). Then
--decode_steps single tokens (default 128) are decoded greedily: ``decode_ms`` is the median
over --decode_reps runs of ``hwh_jax.inference.Generator``'s compiled decode loop (one
``fori_loop`` on the device, greedy), each run's wall time over the steps divided by their
number (all runs in ``decode_ms_runs``). A loop also has a fixed cost, paid once per call
whatever its length (on a GPU the device idles at the loop's start); a second loop of
--short_steps tokens (default 16), timed the same way, splits the two: ``token_ms``, the slope
between the two loops' median times (what one more token costs), and ``loop_fixed_ms``. Short
loops carry more of the fixed cost per token (docs/benchmarks.md). Each loop is also timed
--decode_reps times more on the cache its previous run returned (donated: the same buffers,
its position set back), ``decode_reused_ms`` and ``loop_fixed_reused_ms``: whether the fixed
cost depends on the call's buffers being new. ``decode_call_ms`` is the
median of one jitted call per token from Python
(adds the host's dispatch of the parameter and cache pytrees: 500 parameter arrays for
HwH-380m, 218 for the Transformer). The cache is allocated for the full context, so the latency
is that of a step at the end of a ``context``-long sequence; its size comes from the cache's own
arrays (``hwh_jax.inference.cache.cache_bytes``). The cache is donated to every step (as
``Generator`` does), so one copy of it is alive at a time, and each timing starts from a new
prompt-end cache (with the prefill, a row runs the prompt once more per decode run after the
timed prefill, whose chunk shapes are compiled beforehand); OOMs are caught and reported.
Every compiled executable runs once before it is timed (a first run also loads its kernels onto
the device); the decode loop's first run is kept as ``decode_first_ms``. ``--prefill none``
skips the prompt (its compile is most of a row's time: ~70 s for HwH-380m on the H200): the
cache is allocated empty and its position set to ``context - decode_steps``, so every decode
step costs what it costs at the end of a full context (cached attention computes over every
allocated slot and masks by the slots' times, a GDN state costs the same whatever its values);
prefill figures are then absent from the row. ``--profile DIR`` also traces one decode loop and
prints where its device time goes (``hwh_jax.profiling.profile``).

Each row also carries the step's memory floor (``hwh_jax.inference.roofline``): the bytes a
step must move (every weight once, the FA cache read, the linear-attention states read and
rewritten: ``step_bytes``) and ``floor_ms``, their time at the device's peak memory bandwidth
(--memory_bandwidth in bytes/s, default the vendor's figure for the device kind; none on a CPU),
with ``x_floor`` = decode_ms / floor_ms: near 1 a step is bound by memory, far above it by
kernel launches or compute.
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from _bench import emit, is_oom, parse_impl, parse_overrides, print_device, write_jsonl
from flax import nnx

import kernels_pallas
from hwh_jax.inference import Generator
from hwh_jax.inference.cache import cache_bytes
from hwh_jax.inference.roofline import decode_step_bytes, floor_ms, peak_memory_bandwidth
from hwh_jax.layers.attention import FullAttentionHeads
from hwh_jax.models import HybridLM, model_config
from hwh_jax.profiling import profile


def measure(
    model,
    cfg,
    context,
    batch,
    prefill_chunk,
    decode_steps,
    profile_dir="",
    prefill=True,
    decode_reps=3,
    bandwidth=None,
    short_steps=0,
):
    gen = Generator(model)  # its compiled decode loop: what generate() runs after the prefill
    graphdef, state = gen.graphdef, gen.state

    # one token per jitted call from Python (decode_call_ms), the cache updated in place as in
    # Generator (one copy of it at a time); the prompt goes through Generator's own prefill
    @functools.partial(jax.jit, donate_argnums=2)
    def extend(state, tokens, cache):
        logits, cache = nnx.merge(graphdef, state).extend(tokens, cache)
        return jnp.argmax(logits[:, -1], -1).astype(jnp.int32), cache

    init = jax.jit(lambda state: nnx.merge(graphdef, state).init_cache(batch, context))
    prompt_len = context - decode_steps
    tok = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, prompt_len), np.int32)
    step = prefill_chunk or prompt_len  # 0: the whole prompt at once
    chunks = [(s, min(s + step, prompt_len), s == 0) for s in range(0, prompt_len, step)]

    def after_prompt(cache=None):
        """(next token, last logits, cache) at the prompt's end, from ``cache`` (default a new
        empty one): prefilled, or (prefill=False) its position set there. Every donated use
        starts from a new one."""
        cache = init(state) if cache is None else cache
        if not prefill:
            return (
                jnp.asarray(tok[:, -1]),
                jnp.zeros((batch, cfg.vocab_size), jnp.float32),
                {**cache, "t": jnp.int32(prompt_len)},
            )
        for s, e, fresh in chunks:
            last, cache = compiled[e - s, fresh](state, tok[:, s:e], cache)
        return jnp.argmax(last, -1).astype(jnp.int32), last, cache

    row, compiled = {}, {}
    cache_shape = jax.eval_shape(init, state)
    if prefill:  # compile each chunk shape ahead, run each once, then time the prompt
        t0 = time.perf_counter()
        for n, fresh in sorted({(e - s, fresh) for s, e, fresh in chunks}):
            compiled[n, fresh] = gen.prefill.lower(
                state, jax.ShapeDtypeStruct((batch, n), jnp.int32), cache_shape, fresh=fresh
            ).compile()
        row["prefill_compile_s"] = time.perf_counter() - t0
        for (n, _), fn in compiled.items():  # each executable's first run (loads its kernels)
            jax.block_until_ready(fn(state, tok[:, :n], init(state)))  # untimed, discarded
        cache = jax.block_until_ready(init(state))  # allocated outside the timing
        t0 = time.perf_counter()
        nxt, last, cache = jax.block_until_ready(after_prompt(cache))
        prefill_s = time.perf_counter() - t0
        row.update(prefill_s=prefill_s, prefill_tokens_per_s=batch * prompt_len / prefill_s)
    else:
        nxt, last, cache = jax.block_until_ready(after_prompt())
    times = []
    for i in range(decode_steps):
        t = time.perf_counter()
        nxt, cache = extend(state, nxt[:, None], cache)
        jax.block_until_ready(nxt)
        if i:  # step 0 compiles the one-token shape
            times.append(time.perf_counter() - t)
    del cache
    # The same steps as one device loop (compiled from shapes, then timed from a new cache at
    # the prompt's end); its compiled text names the kernels' sources for --profile.
    logits_shape = jax.ShapeDtypeStruct((batch, cfg.vocab_size), jnp.float32)

    def timed_loop(steps):
        """(compiled loop, ms of its first run, ms of each timed run, ms of each run on the
        previous run's cache), per step."""
        loop = gen.decode.lower(
            state,
            logits_shape,
            cache_shape,
            jax.random.key(0),
            steps=steps,
            temperature=0.0,
            top_p=1.0,
        ).compile()
        run = lambda logits, cache: loop(state, logits, cache, jax.random.key(0))
        first = (
            jnp.zeros((batch, cfg.vocab_size), jnp.float32),  # costs as any cache would
            jax.block_until_ready({**init(state), "t": jnp.int32(prompt_len)}),
        )
        t = time.perf_counter()
        jax.block_until_ready(run(*first))  # its first run: kept apart
        first_ms = 1e3 * (time.perf_counter() - t) / steps
        del first
        loops, reused = [], []
        for i in range(decode_reps):  # each from a new prompt-end cache
            _, last, cache = jax.block_until_ready(after_prompt())
            t = time.perf_counter()
            _, cache = jax.block_until_ready(run(last, cache))
            loops.append(1e3 * (time.perf_counter() - t) / steps)
            if i < decode_reps - 1:
                del cache  # one cache alive at a time
        for _ in range(decode_reps):  # the previous run's cache (its buffers), back at the end
            cache = jax.block_until_ready({**cache, "t": jnp.int32(prompt_len)})
            t = time.perf_counter()
            _, cache = jax.block_until_ready(run(last, cache))
            reused.append(1e3 * (time.perf_counter() - t) / steps)
        del cache
        return run, loop, first_ms, loops, reused

    decode_loop, loop, row["decode_first_ms"], loops, reused = timed_loop(decode_steps)
    row.update(
        decode_ms=statistics.median(loops),
        decode_ms_runs=loops,
        decode_reused_ms=statistics.median(reused),
        decode_reused_ms_runs=reused,
        decode_call_ms=1e3 * statistics.median(times),
    )
    if short_steps:  # a loop's fixed cost: the slope between two lengths' medians
        *_, short, short_reused = timed_loop(short_steps)
        token = (row["decode_ms"] * decode_steps - statistics.median(short) * short_steps) / (
            decode_steps - short_steps
        )
        fixed = lambda runs: (statistics.median(runs) - token) * short_steps
        row.update(
            decode_short_ms=statistics.median(short),
            decode_short_ms_runs=short,
            decode_short_reused_ms_runs=short_reused,
            token_ms=token,
            loop_fixed_ms=fixed(short),
            loop_fixed_reused_ms=fixed(short_reused),
        )
    step_bytes = decode_step_bytes(state, cfg, batch, context)
    row.update(step_bytes=step_bytes, floor_ms=floor_ms(step_bytes["total"], bandwidth))
    if row["floor_ms"]:
        row["x_floor"] = row["decode_ms"] / row["floor_ms"]
    if profile_dir:
        _, last, cache = jax.block_until_ready(after_prompt())
        with profile.capture(profile_dir):
            jax.block_until_ready(decode_loop(last, cache))
        row["profile"] = profile.summarize(profile_dir, steps=decode_steps, hlo_text=loop.as_text())
        print(profile.format_summary(row["profile"], row["decode_ms"]), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", nargs="+", default=["transformer", "gdn", "layerwise", "hwh"])
    ap.add_argument("--size", default="380m")
    ap.add_argument("--contexts", nargs="+", type=int, default=[2048, 8192, 32768, 65536])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    ap.add_argument(
        "--prefill_chunk",
        type=int,
        default=0,
        help="0: the whole prompt at once, as Generator prefills",
    )
    ap.add_argument(
        "--decode_steps",
        type=int,
        default=128,
        help="tokens of the timed decode loop (decode_ms: its time per token)",
    )
    ap.add_argument(
        "--short_steps",
        type=int,
        default=16,
        help="tokens of a second, shorter loop, timed the same way: the slope between "
        "the two is token_ms, the rest a loop's fixed cost loop_fixed_ms "
        "(0: no second loop)",
    )
    ap.add_argument(
        "--decode_reps",
        type=int,
        default=3,
        help="timed decode loops per row (decode_ms: their median)",
    )
    ap.add_argument(
        "--prefill",
        choices=("full", "none"),
        default="full",
        help="none: no prompt, an empty cache at position context - decode_steps "
        "(decode latency and cache memory only; see the module docstring)",
    )
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--decode_attn_impls",
        nargs="+",
        default=["auto"],
        help="model.decode_attention.impl of each row (auto | reference | pallas): "
        "the FA heads' attention over the cache in a decode step; "
        "pallas:KEY=VALUE,... sets DecodeAttentionSettings fields",
    )
    ap.add_argument(
        "--matmul_impls",
        nargs="+",
        default=["auto"],
        help="model.matmul.impl of each row (auto | reference | pallas): the "
        "products of a decode step's rows (kernels_pallas.skinny_matmul); "
        "pallas:KEY=VALUE,... sets SkinnyMatmulSettings fields",
    )
    ap.add_argument(
        "--profile",
        default="",
        help="directory: trace one decode loop per row and print its device time",
    )
    ap.add_argument(
        "--memory_bandwidth",
        type=float,
        default=0.0,
        help="bytes/s of the floor (0: the device kind's peak, if known)",
    )
    ap.add_argument(
        "--override",
        nargs="*",
        default=[],
        metavar="FIELD=VALUE",
        help="ModelConfig fields, e.g. gdn.step_min_programs=1 (Python literals)",
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    try:
        overrides = parse_overrides(args.override)
    except ValueError as e:
        ap.error(str(e))
    if not 0 <= args.short_steps < args.decode_steps:
        ap.error(
            f"--short_steps {args.short_steps}: 0 (none) or fewer than --decode_steps "
            f"{args.decode_steps}"
        )
    print_device()
    bandwidth = args.memory_bandwidth or peak_memory_bandwidth(jax.devices()[0].device_kind)
    rows = []
    for arch, impl, mm in itertools.product(args.archs, args.decode_attn_impls, args.matmul_impls):
        name, opts = parse_impl(impl)
        mm_name, mm_opts = parse_impl(mm)
        cfg = model_config(
            arch,
            args.size,
            **{
                "dtype": args.dtype,
                **overrides,
                "decode_attention": {**overrides.get("decode_attention", {}), "impl": name},
                "matmul": {**overrides.get("matmul", {}), "impl": mm_name},
            },
        )
        model = HybridLM(cfg, rngs=nnx.Rngs(0))
        for _, m in nnx.iter_graph(model):  # launch settings: every module's decode op
            if opts and isinstance(m, FullAttentionHeads):
                m.decode_settings = m.decode_settings.replace(**opts)
            if mm_opts and isinstance(m, nnx.Module) and hasattr(m, "matmul_settings"):
                m.matmul_settings = m.matmul_settings.replace(**mm_opts)
        for T in args.contexts:
            for B in args.batches:
                row = {
                    "arch": arch,
                    "size": args.size,
                    "context": T,
                    "batch": B,
                    "decode_attn_impl": impl,
                    "matmul_impl": mm,
                    **({"overrides": overrides} if overrides else {}),
                    "cache_gib": cache_bytes(cfg, B, T)["total"] / 2**30,
                }
                try:
                    prof = (
                        f"{args.profile}/{arch}_{impl}_{mm}_{args.size}_{T}_b{B}"
                        if args.profile
                        else ""
                    )
                    row.update(
                        measure(
                            model,
                            cfg,
                            T,
                            B,
                            args.prefill_chunk,
                            args.decode_steps,
                            prof,
                            args.prefill == "full",
                            args.decode_reps,
                            bandwidth,
                            args.short_steps,
                        )
                    )
                except Exception as e:  # XLA reports OOM as several types
                    if not is_oom(e):
                        raise
                    row["oom"] = True
                if row.get("oom"):  # free the failed row's arrays (its traceback held them)
                    gc.collect()
                row["kernels"] = kernels_pallas.chosen()
                emit(rows, row)
                write_jsonl(args.out, rows)  # after every row: a cut run keeps its rows
    print(
        f"\n{'arch':12s} {'attn':>9s} {'matmul':>9s} {'ctx':>6s} {'B':>3s} {'cache GiB':>9s} "
        f"{'prefill s':>9s} {'decode ms/token':>15s} {'marginal':>9s} {'loop fixed':>10s} "
        f"{'reused':>7s} "
        f"{'per call':>9s} {'floor ms':>9s} {'x floor':>8s}"
    )
    for r in rows:
        if r.get("oom"):
            print(
                f"{r['arch']:12s} {r['decode_attn_impl']:>9s} {r['matmul_impl']:>9s} "
                f"{r['context']:6d} {r['batch']:3d} {r['cache_gib']:9.2f}  OOM"
            )
            continue
        pre = f"{r['prefill_s']:9.2f}" if "prefill_s" in r else f"{'-':>9}"
        floor = (
            f"{r['floor_ms']:9.3f} {r['x_floor']:8.1f}"
            if r.get("floor_ms")
            else f"{'-':>9} {'-':>8}"
        )
        slope = (
            f"{r['token_ms']:9.2f} {r['loop_fixed_ms']:10.2f} {r['loop_fixed_reused_ms']:7.2f}"
            if "token_ms" in r
            else f"{'-':>9} {'-':>10} {'-':>7}"
        )
        print(
            f"{r['arch']:12s} {r['decode_attn_impl']:>9s} {r['matmul_impl']:>9s} "
            f"{r['context']:6d} {r['batch']:3d} {r['cache_gib']:9.2f} {pre} "
            f"{r['decode_ms']:15.2f} {slope} {r['decode_call_ms']:9.2f} "
            f"{floor}"
        )


if __name__ == "__main__":
    main()
