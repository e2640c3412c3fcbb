"""Token shards (hwh_jax.data.shards, launch.prepare_data): the fast GPT-2 BPE gives the
reference's ids on every shipped corpus; a prepared stream is exactly the in-memory stream, in
one process or several, stopped and resumed or not; training reads it lazily and resumes
exactly after SIGTERM."""

import hashlib
import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hwh_jax.data import bpe_pieces, shards, sources
from hwh_jax.data.packing import concat_documents
from hwh_jax.data.paths import resolve
from hwh_jax.data.pipeline import DataSpec, build_splits
from hwh_jax.data.tokenizers import GPT2BPE, GPT2BPEReference

ROOT = Path(__file__).resolve().parents[2]

# SHA-256 (first 16 hex digits) of every document's GPT2BPEReference ids, as uint32, in order,
# and their count: the pure-Python BPE's output on each shipped corpus
REFERENCE_IDS = {
    "dickens/dickens.zip": (2_677_522, "f23427da5d554eb2"),
    "gutenberg/gutenberg_train.txt.gz": (10_307_876, "879424eacf542994"),
    "gutenberg/gutenberg_valid.txt.gz": (350_860, "3966c339a42eab50"),
    "tinyshakespeare/input.txt.gz": (338_025, "0c00ab83dc7f4666"),
    "wikitext2/valid.txt.gz": (258_659, "9c87f1a0a64b3a69"),
    "wikitext2/test.txt.gz": (295_877, "b707897cad36e76a"),
    "pg_essays/PaulGrahamEssays": (152_169, "e0dd25cb517e4ebf"),
}
TRICKY = [
    "",
    " ",
    "  leading and trailing  ",
    "tabs\tand\r\nnewlines\n\n\n",
    "it's we'll I'M",
    "ünïcödé — “quotes” 日本語 🤖 \u200b",
    "<|endoftext|> is text here",
    "123 4567 8.9e10",
    "a" * 3000,
    "   \n  x",
    "x\n   ",
    "don't  stop",
    "'s's 's",
]


@pytest.fixture(scope="module")
def gpt2():
    return GPT2BPE(resolve("gpt2_bpe"))


def _ids_digest(tok, corpus):
    h, n = hashlib.sha256(), 0
    for f in sources.expand([resolve(corpus)]):
        for doc in sources.text_documents(f):
            ids = np.asarray(tok.encode(doc), np.uint32)
            h.update(ids.tobytes())
            n += len(ids)
    return n, h.hexdigest()[:16]


@pytest.mark.parametrize("corpus", sorted(REFERENCE_IDS))
def test_fast_gpt2_gives_the_reference_ids_on_every_shipped_corpus(gpt2, corpus):
    assert _ids_digest(gpt2, corpus) == REFERENCE_IDS[corpus]


def test_fast_gpt2_equals_the_reference_on_edge_cases_and_a_sample(gpt2):
    ref = GPT2BPEReference(resolve("gpt2_bpe"))
    assert ref.eos_id == gpt2.eos_id == 50256 and ref.vocab_size == gpt2.vocab_size == 50257
    docs = list(sources.text_documents(resolve("tinyshakespeare/input.txt.gz")))
    sample = TRICKY + [docs[0][:20_000]]
    assert gpt2.encode_batch(sample) == ref.encode_batch(sample)
    for text in sample:
        assert gpt2.decode(gpt2.encode(text)) == text
    # the reference digest above is the reference's, not a copy of the fast tokenizer's
    assert (
        _ids_digest(ref, "pg_essays/PaulGrahamEssays")
        == REFERENCE_IDS["pg_essays/PaulGrahamEssays"]
    )


def test_the_fast_path_equals_tiktoken_with_gpt2s_own_regex_on_random_text(gpt2):
    """Random strings over every white-space character of the regex engine (and some that are
    not white space there), letters, digits, punctuation and contractions, one at a time and as
    one batch (texts laid end to end, long ones cut at newlines): the fast path (NumPy
    pre-tokenizer, table of pieces) == ``encode_exact`` (tiktoken with GPT-2's own regex)."""
    alphabet = (
        list(
            "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2005\u200a\u2028\u2029\u202f\u205f"
            "\u3000\x1c\x1d\u200b"
        )
        + list("aZé日1٣'\"-.,!sdmtlvre")
        + ["\ue000", "🤖", "'s", "'ll", "'re", "'v", "<|endoftext|>", "x" * 20]
    )
    rng = np.random.default_rng(0)
    texts = ["".join(rng.choice(alphabet, int(rng.integers(0, 40)))) for _ in range(3000)]
    for text in texts[:1000]:
        assert gpt2.encode(text) == gpt2.encode_exact(text), repr(text)
    for group_chars in (1 << 18, 50):  # one group; many, long texts cut
        got = bpe_pieces.encode_documents(texts, gpt2._table, group_chars=group_chars)
        for text, ids in zip(texts, got):
            assert ids.tolist() == gpt2.encode_exact(text), repr(text)


def test_the_piece_table_gives_the_same_ids_when_cleared_or_grown(gpt2):
    """A table cleared at every group with new pieces (max_entries=0), and one grown from 16
    slots by a corpus, give tiktoken's ids; a text with a lone surrogate goes tiktoken's way,
    the others of its batch the fast way."""
    text = next(iter(sources.text_documents(resolve("wikitext2/valid.txt.gz"))))[:200_000]
    want = gpt2.encode_exact(text)
    cleared = bpe_pieces.PieceTable(gpt2.enc, max_entries=0)
    assert bpe_pieces.encode_documents([text], cleared, group_chars=5000)[0].tolist() == want
    grown = bpe_pieces.PieceTable(gpt2.enc, min_bits=4)
    assert bpe_pieces.encode_documents([text] * 2, grown)[1].tolist() == want
    assert grown.bits > 12 and grown.used * 2 <= 1 << grown.bits
    odd = ["fine text", "a lone \ud800 surrogate", "more 's text"]
    assert [ids.tolist() for ids in gpt2.encode_arrays(odd)] == [gpt2.encode_exact(t) for t in odd]


def test_distinct_pieces_are_exact_even_when_their_mixes_collide(monkeypatch):
    """New pieces are told apart by a sort of a 64-bit mix of their keys, then checked word by
    word: with every mix equal (both multipliers 0) the sort of the full keys decides."""
    rng = np.random.default_rng(1)
    k1 = rng.integers(0, 40, 2000).astype(np.uint64)
    k2 = rng.integers(1, 4, 2000).astype(np.uint64)
    want = set(zip(k1.tolist(), k2.tolist()))
    for mul in (None, np.uint64(0)):
        if mul is not None:
            monkeypatch.setattr(bpe_pieces, "_MUL1", mul)
            monkeypatch.setattr(bpe_pieces, "_MUL2", mul)
        one = bpe_pieces._distinct(k1, k2)
        assert len(one) == len(want) == len(set(zip(k1[one].tolist(), k2[one].tolist())))


def _documents(n=300, seed=0):
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "the", "a", "of", "\n", "42", "é"]
    return [" ".join(rng.choice(words, int(rng.integers(0, 60)))) for _ in range(n)]


def _expected(tok, docs):
    return concat_documents((tok.encode(d) for d in docs), tok.eos_id)


SMALL = dict(block=37, shard_blocks=5, chunk_chars=400)  # many blocks, shards and chunks


def test_a_prepared_stream_is_the_in_memory_stream(gpt2, tmp_path):
    docs = _documents()
    out = shards.prepare(
        docs, gpt2, tmp_path / "p", source={"test": 1}, echo=lambda s: None, **SMALL
    )
    stream = shards.TokenStream(out)
    want = _expected(gpt2, docs)
    manifest = shards.read_manifest(out)
    assert manifest["documents"] == len(docs) and manifest["tokens"] == len(want) == len(stream)
    assert len(manifest["shards"]) > 3 and manifest["tokenizer"]["sha256"]
    np.testing.assert_array_equal(np.asarray(stream), want)
    rng = np.random.default_rng(1)
    for _ in range(50):  # ranges across blocks and shards
        a, b = sorted(rng.integers(0, len(want) + 1, 2))
        np.testing.assert_array_equal(stream[a:b], want[a:b])
        np.testing.assert_array_equal(np.asarray(stream.view(a, b)), want[a:b])
    assert stream[-1] == want[-1] and list(stream.view(5, 90)) == want[5:90].tolist()
    np.testing.assert_array_equal(stream.counts(), np.bincount(want, minlength=gpt2.vocab_size))
    view = stream.view(100, len(want) - 50)
    np.testing.assert_array_equal(
        view.counts(), np.bincount(want[100:-50], minlength=gpt2.vocab_size)
    )
    again = pickle.loads(pickle.dumps(view))  # as Grain's worker processes get it
    np.testing.assert_array_equal(again[3:700], want[103:800])
    with pytest.raises(TypeError, match="contiguous slice"):
        stream[::2]


def test_a_damaged_shard_is_named_before_its_bytes_are_read(gpt2, tmp_path):
    """A shard truncated (refused when the folder is opened) or with flipped bytes (refused
    when a process first reads it): one line naming the shard and the remedy, never a crash
    of the native reader."""
    out = shards.prepare(
        _documents(), gpt2, tmp_path / "p", source={"test": 1}, echo=lambda s: None, **SMALL
    )
    manifest = shards.read_manifest(out)
    assert all(len(s["sha256"]) == 64 and s["bytes"] > 0 for s in manifest["shards"])
    shard = out / manifest["shards"][1]["file"]
    good = shard.read_bytes()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF
    shard.write_bytes(bytes(flipped))
    stream = shards.TokenStream(out)  # sizes agree: opens
    stream[0:10]  # shard 0: fine
    with pytest.raises(shards.ShardDamaged) as e:
        np.asarray(stream)
    message = str(e.value)
    assert "\n" not in message and str(shard) in message and "SHA-256" in message
    assert "launch.prepare_data" in message
    shard.write_bytes(good[: len(good) // 2])
    with pytest.raises(shards.ShardDamaged, match=r"truncated or replaced"):
        shards.TokenStream(out)
    shard.write_bytes(good)
    np.testing.assert_array_equal(
        np.asarray(shards.TokenStream(out)), _expected(gpt2, _documents())
    )


def test_worker_processes_prepare_the_same_stream(gpt2, tmp_path):
    docs = _documents(seed=2)
    one = shards.prepare(docs, gpt2, tmp_path / "one", source={}, echo=lambda s: None, **SMALL)
    two = shards.prepare(
        docs, gpt2, tmp_path / "two", source={}, workers=2, echo=lambda s: None, **SMALL
    )
    np.testing.assert_array_equal(
        np.asarray(shards.TokenStream(one)), np.asarray(shards.TokenStream(two))
    )
    assert np.array_equal(np.load(one / "counts.npy"), np.load(two / "counts.npy"))


def test_a_stopped_preparation_resumes_to_the_same_stream(gpt2, tmp_path):
    docs = _documents(seed=3)

    def stopping(after):
        for i, d in enumerate(docs):
            if i == after:
                raise KeyboardInterrupt
            yield d

    out = tmp_path / "p"
    with pytest.raises(KeyboardInterrupt):
        shards.prepare(stopping(200), gpt2, out, source={}, echo=lambda s: None, **SMALL)
    progress = json.loads((out / "progress.json").read_text())
    assert 0 < progress["documents"] < 200 and progress["shards"]
    with pytest.raises(ValueError, match="another source or tokenizer"):
        shards.prepare(docs, gpt2, out, source={"other": 1}, echo=lambda s: None, **SMALL)
    said = []
    shards.prepare(docs, gpt2, out, source={}, echo=said.append, **SMALL)
    assert said[0].startswith(f"resuming {out}: {len(progress['shards'])} shards")
    np.testing.assert_array_equal(np.asarray(shards.TokenStream(out)), _expected(gpt2, docs))
    np.testing.assert_array_equal(
        np.load(out / "counts.npy"), np.bincount(_expected(gpt2, docs), minlength=gpt2.vocab_size)
    )
    assert not (out / "progress.json").exists()
    with pytest.raises(ValueError, match="did not finish"):
        (out / "manifest.json").write_text(json.dumps({"complete": False}))
        shards.TokenStream(out)


def test_processes_preparing_one_folder_at_once_wait_for_the_first(gpt2, tmp_path):
    """Two processes start preparing one folder while a third holds its lock: both wait, then
    one prepares and the other takes its result."""
    import fcntl

    script = (
        "import sys, numpy as np\n"
        "from hwh_jax.data import shards\n"
        "from hwh_jax.data.paths import resolve\n"
        "from hwh_jax.data.tokenizers import GPT2BPE\n"
        "rng = np.random.default_rng(7)\n"
        "docs = [' '.join(map(str, rng.integers(0, 10**6, 50))) for _ in range(500)]\n"
        "shards.prepare(docs, GPT2BPE(resolve('gpt2_bpe')), sys.argv[1], source={},\n"
        "               block=997, shard_blocks=3, chunk_chars=20000)\n"
    )
    with open(tmp_path / "p.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        procs = [
            subprocess.Popen(
                [sys.executable, "-u", "-c", script, str(tmp_path / "p")],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            for _ in range(2)
        ]
        for proc in procs:  # each says it waits before the lock is freed
            line = proc.stdout.readline()
            while line and not line.startswith("waiting"):
                line = proc.stdout.readline()
            assert line.startswith(f"waiting for another process preparing {tmp_path / 'p'}")
    said = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], said
    assert sum("prepared" in s for s in said) == 1, said  # one did the work
    rng = np.random.default_rng(7)
    docs = [" ".join(map(str, rng.integers(0, 10**6, 50))) for _ in range(500)]
    np.testing.assert_array_equal(
        np.asarray(shards.TokenStream(tmp_path / "p")), _expected(gpt2, docs)
    )


def test_text_sources_are_prepared_on_first_use_and_streamed(gpt2, tmp_path, monkeypatch):
    monkeypatch.setenv("HWH_CACHE_DIR", str(tmp_path / "cache"))
    docs = _documents(seed=4)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    spec = DataSpec(paths=(str(corpus),), heldout_fraction=0.1, tokenizer="gpt2")
    splits = build_splits(spec, seq_len=16)
    assert isinstance(splits.train.stream, shards.TokenStream)
    want = _expected(gpt2, docs)
    n_held = len(splits.heldout.stream)
    np.testing.assert_array_equal(np.asarray(splits.train.stream), want[:-n_held])
    np.testing.assert_array_equal(np.asarray(splits.heldout.stream), want[-n_held:])
    prepared = [p for p in (tmp_path / "cache" / "shards").iterdir() if p.is_dir()]
    assert len(prepared) == 1 and shards.is_prepared(prepared[0])
    # the prepared folder as a source of its own, and the tokenizer it was made with checked
    same = build_splits(
        DataSpec(
            source="shards", paths=(str(prepared[0]),), tokenizer="gpt2", heldout_fraction=0.1
        ),
        seq_len=16,
    )
    np.testing.assert_array_equal(np.asarray(same.train.stream), want[:-n_held])
    manifest = json.loads((prepared[0] / "manifest.json").read_text())
    manifest["tokenizer"]["sha256"] = "0" * 64
    (prepared[0] / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="prepared with tokenizer gpt2_bpe"):
        build_splits(
            DataSpec(source="shards", paths=(str(prepared[0]),), tokenizer="gpt2"), seq_len=16
        )


def test_prepare_data_reads_parquet_and_jsonl_with_progress(tmp_path, gpt2):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = _documents(seed=5)
    pq.write_table(
        pa.table({"content": docs[:150], "id": list(range(150))}), tmp_path / "a.parquet"
    )
    (tmp_path / "b.jsonl").write_text(
        "".join(json.dumps({"content": d}) + "\n" for d in docs[150:])
    )
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.prepare_data",
            f"--input={tmp_path}",
            "--text_field=content",
            f"--out={out}",
            "--workers=2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prepared" in proc.stdout + proc.stderr and "tokens/s" in proc.stdout + proc.stderr
    manifest = shards.read_manifest(out)
    assert manifest["documents"] == len(docs) and len(manifest["source"]["paths"]) == 2
    np.testing.assert_array_equal(np.asarray(shards.TokenStream(out)), _expected(gpt2, docs))
    bad = subprocess.run(
        [sys.executable, "-m", "launch.prepare_data", f"--out={out}2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert bad.returncode != 0 and "give --input" in bad.stdout + bad.stderr


def test_training_from_shards_resumes_exactly_after_sigterm(gpt2, tmp_path, monkeypatch):
    from configs import base
    from hwh_jax.training import checkpoint as ckpt_lib
    from hwh_jax.training.trainer import train_and_evaluate

    monkeypatch.setenv("HWH_CACHE_DIR", str(tmp_path / "cache"))
    text = sources.read_text(resolve("tinyshakespeare/input.txt.gz"))[:120_000]
    folder = shards.prepare(
        text.split("\n\n"),
        gpt2,
        tmp_path / "shards",
        source={},
        echo=lambda s: None,
        block=1000,
        shard_blocks=4,
    )

    def config():
        c = base.get_config("transformer_tiny")  # the data state is what is tested here
        c.seq_len, c.model.dtype, c.model.la_chunk_size = 32, "float32", 16
        c.data.source, c.data.paths, c.data.tokenizer = "shards", (str(folder),), "gpt2"
        c.data.heldout_fraction = 0.05
        t = c.train
        t.steps, t.batch_size, t.lr, t.warmup_steps = 6, 8, 3e-3, 2
        t.log_every, t.eval_every, t.checkpoint_every, t.eval_sequences = 1, 0, 2, 16
        t.mesh = (1, 1, 1)
        c.eval.at_end = False
        return c

    real_save = ckpt_lib.Checkpointer.save

    def save_with_signal(self, step, *args, **kw):
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_save(self, step, *args, **kw)

    monkeypatch.setattr(ckpt_lib.Checkpointer, "save", save_with_signal)
    first = train_and_evaluate(config(), tmp_path / "run")
    assert first.stopped_early and first.final_step == 4
    monkeypatch.setattr(ckpt_lib.Checkpointer, "save", real_save)
    second = train_and_evaluate(config(), tmp_path / "run")
    straight = train_and_evaluate(config(), tmp_path / "straight")
    assert {**first.losses, **second.losses} == straight.losses  # bitwise


def test_the_1b4_config_reads_fineweb_edu_prepared_from_its_parquet_files(
    tmp_path, monkeypatch, gpt2
):
    """configs/hwh_1b4.py's data block on a local stand-in for FineWeb-Edu's sample (Parquet
    files with a "text" column, in the folder its docstring downloads to)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from configs import hwh_1b4
    from hwh_jax.training.specs import run_specs

    monkeypatch.setenv("HWH_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="launch.prepare_data"):
        run_specs(hwh_1b4.get_config())
    raw = tmp_path / "fineweb_edu" / "sample" / "10BT"
    raw.mkdir(parents=True)
    docs = _documents(n=2000, seed=6)
    for i in range(2):
        pq.write_table(
            pa.table({"text": docs[i::2], "score": [3.1] * 1000}), raw / f"00{i}_00000.parquet"
        )
    files = sources.expand([raw])
    shards.prepare(
        (d for f in files for d in sources.text_documents(f)),
        gpt2,
        tmp_path / "fineweb_edu_10bt_gpt2",
        source={},
        echo=lambda s: None,
    )
    splits = build_splits(run_specs(hwh_1b4.get_config()).data, seq_len=16)
    want = _expected(gpt2, docs[0::2] + docs[1::2])
    assert len(splits.train.stream) + len(splits.heldout.stream) == len(want)
    np.testing.assert_array_equal(splits.train[3]["inputs"], want[3 * 17 : 4 * 17 - 1])
