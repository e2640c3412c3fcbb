r"""Tokenizer and preparation throughput on this host's CPUs.

  python bench/tokenizer_speed.py --corpus gutenberg/gutenberg_train.txt.gz --workers 1 2 \
      --out results.jsonl

Rows: the GPT-2 BPE's tokens/s on one core, on the same documents already in memory (only
encoding is timed): the pure-Python reference (``GPT2BPEReference``), tiktoken with GPT-2's own
regex (``GPT2BPE.encode_exact``) and ``GPT2BPE``'s fast path (``encode_arrays``: the regex
without its look-ahead, uint32 arrays); then ``shards.prepare`` of the corpus end to end (read, decode, tokenise in ``workers``
processes, write shards) for each --workers count. Both tokenizers' ids are checked equal.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default="gutenberg/gutenberg_train.txt.gz",
                   help="a shipped corpus or any text file/folder")
    p.add_argument("--reference_chars", type=float, default=20e6,
                   help="characters the slow reference tokenises (the fast one: all)")
    p.add_argument("--workers", type=int, nargs="*", default=[1, 2],
                   help="process counts to time shards.prepare with")
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

    emit({"host": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
          "python": sys.version.split()[0], "tiktoken": tiktoken.__version__})
    files = sources.expand([resolve(args.corpus)])
    docs = [d for f in files for d in sources.text_documents(f)]
    sample, chars = [], 0
    for d in docs:                                  # the reference's share: whole documents
        sample.append(d[:int(args.reference_chars) - chars])
        chars += len(sample[-1])
        if chars >= args.reference_chars:
            break
    bpe_dir = resolve("gpt2_bpe")
    fast, ref = GPT2BPE(bpe_dir), GPT2BPEReference(bpe_dir)
    runs = (("reference", ref.encode_batch, sample),
            ("tiktoken_gpt2_regex", lambda ts: [fast.encode_exact(t) for t in ts], sample),
            ("gpt2bpe_fast_path", fast.encode_arrays, sample),
            ("gpt2bpe_fast_path", fast.encode_arrays, docs))
    for name, encode, texts in runs:
        t0 = time.perf_counter()
        ids = encode(texts)
        dt = time.perf_counter() - t0
        n = sum(map(len, ids))
        emit({"part": "encode_one_core", "tokenizer": name, "chars": sum(map(len, texts)),
              "tokens": n, "seconds": round(dt, 2), "tokens_per_s": round(n / dt)})
        if texts is sample and name == "reference":
            ref_ids = ids
        elif texts is sample and [list(map(int, x)) for x in ids] != ref_ids:
            raise SystemExit(f"{name}'s ids differ from the reference's")
    size = sum(f.stat().st_size for f in files)
    for w in args.workers:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            out = shards.prepare(docs, fast, f"{tmp}/p", source={}, workers=w if w > 1 else 0,
                                 echo=lambda s: None)
            dt = time.perf_counter() - t0
            n = shards.read_manifest(out)["tokens"]
        emit({"part": "prepare", "workers": w, "bytes": size, "tokens": n,
              "seconds": round(dt, 2), "tokens_per_s": round(n / dt)})
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
