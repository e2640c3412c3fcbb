r"""Tokenizer and preparation throughput on this host's CPUs.

  python bench/tokenizer_speed.py --corpus gutenberg/gutenberg_train.txt.gz --workers 1 2 \
      --out results.jsonl

Rows: the GPT-2 BPE's tokens/s on one core, on the same documents already in memory (only
encoding is timed): the pure-Python reference (``GPT2BPEReference``, with its cache of pieces),
tiktoken with GPT-2's own regex (``GPT2BPE.encode_exact``) and ``GPT2BPE`` (``encode_arrays``:
NumPy pre-tokenizer and table of pieces, uint32 arrays), each fresh; then the reference and
``GPT2BPE`` again after a pass over the rest of the corpus (their caches filled by other text
of the same kind: the steady state of a long preparation). --repeats rounds, interleaved; the
ratio row gives the median, min and max over the rounds of each one's rate over the
reference's in the same round and state. Then ``GPT2BPE`` over the whole corpus in one pass,
and ``shards.prepare`` of the corpus end to end (read, decode, tokenise in ``workers``
processes, write shards) for each --workers count. The character classes' build (once a
process) is a row of its own. Every tokenizer's ids are checked equal to the reference's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--corpus",
        default="gutenberg/gutenberg_train.txt.gz",
        help="a shipped corpus or any text file/folder",
    )
    p.add_argument(
        "--reference_chars",
        type=float,
        default=20e6,
        help="characters the slow reference tokenises (the fast one: all)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved timings of the reference and the fast paths on the text",
    )
    p.add_argument(
        "--workers",
        type=int,
        nargs="*",
        default=[1, 2],
        help="process counts to time shards.prepare with",
    )
    p.add_argument("--out", default="", help="also write the rows as JSON lines here")
    args = p.parse_args()
    import tiktoken

    from hwh_jax.data import shards, sources
    from hwh_jax.data.paths import resolve
    from hwh_jax.data.tokenizers import GPT2BPE, GPT2BPEReference

    rows = []

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    emit(
        {
            "host": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "tiktoken": tiktoken.__version__,
        }
    )
    files = sources.expand([resolve(args.corpus)])
    docs = [d for f in files for d in sources.text_documents(f)]
    sample, chars = [], 0
    for d in docs:  # the reference's share: whole documents
        sample.append(d[: int(args.reference_chars) - chars])
        chars += len(sample[-1])
        if chars >= args.reference_chars:
            break
    rest = [docs[len(sample) - 1][len(sample[-1]) :], *docs[len(sample) :]]
    rest = [d for d in rest if d]
    bpe_dir = resolve("gpt2_bpe")
    fresh = GPT2BPE(bpe_dir)
    t0 = time.perf_counter()
    fresh.encode("the character classes, once a process")
    emit({"part": "gpt2bpe_start", "seconds": round(time.perf_counter() - t0, 2)})
    ref_ids = None

    def timed(name, encode, texts, repeat):
        nonlocal ref_ids
        t0 = time.perf_counter()
        ids = encode(texts)
        dt = time.perf_counter() - t0
        n = sum(map(len, ids))
        if name == "reference":
            ref_ids = [list(map(int, x)) for x in ids]
        elif texts is sample and [list(map(int, x)) for x in ids] != ref_ids:
            raise SystemExit(f"{name}'s ids differ from the reference's")
        emit(
            {
                "part": "encode_one_core",
                "tokenizer": name,
                "repeat": repeat,
                "chars": sum(map(len, texts)),
                "tokens": n,
                "seconds": round(dt, 2),
                "tokens_per_s": round(n / dt),
            }
        )
        return n / dt

    ratios = {}
    for r in range(args.repeats):  # interleaved: each ratio from neighbouring runs
        fast = GPT2BPE(bpe_dir)
        speed = {
            "reference": timed("reference", GPT2BPEReference(bpe_dir).encode_batch, sample, r),
            "tiktoken_gpt2_regex": timed(
                "tiktoken_gpt2_regex", lambda ts: [fast.encode_exact(t) for t in ts], sample, r
            ),
            "gpt2bpe": timed("gpt2bpe", fast.encode_arrays, sample, r),
        }
        if rest:  # both caches first filled by the rest of the corpus
            ref = GPT2BPEReference(bpe_dir)
            ref.encode_batch(rest)
            speed["reference_after_rest"] = timed(
                "reference_after_rest", ref.encode_batch, sample, r
            )
            fast = GPT2BPE(bpe_dir)
            fast.encode_arrays(rest)
            speed["gpt2bpe_after_rest"] = timed("gpt2bpe_after_rest", fast.encode_arrays, sample, r)
        for name, v in speed.items():
            base = speed["reference_after_rest" if name.endswith("after_rest") else "reference"]
            ratios.setdefault(name, []).append(v / base)
    emit(
        {
            "part": "ratio_to_reference",
            "repeats": args.repeats,
            **{
                name: {
                    "median": round(statistics.median(v), 1),
                    "min": round(min(v), 1),
                    "max": round(max(v), 1),
                }
                for name, v in ratios.items()
                if not name.startswith("reference")
            },
        }
    )
    timed("gpt2bpe_whole_corpus_one_pass", GPT2BPE(bpe_dir).encode_arrays, docs, 0)
    size = sum(f.stat().st_size for f in files)
    for w in args.workers:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            out = shards.prepare(
                docs, fast, f"{tmp}/p", source={}, workers=w if w > 1 else 0, echo=lambda s: None
            )
            dt = time.perf_counter() - t0
            n = shards.read_manifest(out)["tokens"]
        emit(
            {
                "part": "prepare",
                "workers": w,
                "bytes": size,
                "tokens": n,
                "seconds": round(dt, 2),
                "tokens_per_s": round(n / dt),
            }
        )
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
