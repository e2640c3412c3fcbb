"""Sources, tokenizers, packing, shuffling and per-process sharding of the input pipeline."""

import concurrent.futures
import gzip
import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hwh_jax.data import sources
from hwh_jax.data.packing import PackedSequences, concat_documents
from hwh_jax.data.paths import resolve
from hwh_jax.data.pipeline import DataSpec, build_splits, train_dataset
from hwh_jax.data.retrieval import RetrievalMix
from hwh_jax.data.ruler import WORDS
from hwh_jax.data.tokenizers import GPT2BPE, SentencePieceTokenizer, train_sentencepiece

SHAKESPEARE = resolve("tinyshakespeare/input.txt.gz")


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    text = sources.read_text(SHAKESPEARE)[:300_000]
    return train_sentencepiece([text], 512, tmp_path_factory.mktemp("sp"), key="test")


def test_packing_keeps_every_token_once():
    rng = np.random.default_rng(0)
    docs = [rng.integers(5, 100, rng.integers(1, 40)) for _ in range(50)]
    stream = concat_documents(docs, eos_id=1)
    assert len(stream) == sum(len(d) + 1 for d in docs)
    seqs = PackedSequences(stream, 16, eos_id=1, pad_id=0)
    seen = []
    for i in range(len(seqs)):
        row = seqs[i]
        n_valid = int(row["loss_mask"].sum()) + 1 if i < len(seqs) - 1 else None
        window = np.concatenate([row["inputs"], row["targets"][-1:]])
        if i < len(seqs) - 1:
            assert n_valid == 17
            seen.append(window)
        else:
            valid = int(row["loss_mask"].sum()) + 1
            seen.append(window[:valid])
    np.testing.assert_array_equal(np.concatenate(seen), stream)


def test_segments_and_positions():
    stream = np.array([5, 6, 1, 7, 8, 9, 1, 4], np.uint32)  # docs [5 6] [7 8 9] [4], eos = 1
    seqs = PackedSequences(stream, 9, eos_id=1, pad_id=0)  # one padded window of 10
    row = seqs[0]
    np.testing.assert_array_equal(row["inputs"], [5, 6, 1, 7, 8, 9, 1, 4, 0])
    np.testing.assert_array_equal(row["segment_ids"], [1, 1, 1, 2, 2, 2, 2, 3, 0])
    np.testing.assert_array_equal(row["positions"], [0, 1, 2, 0, 1, 2, 3, 0, 0])
    np.testing.assert_array_equal(row["loss_mask"], [1, 1, 1, 1, 1, 1, 1, 0, 0])


def test_shuffling_is_deterministic_and_a_permutation_per_epoch():
    seqs = PackedSequences(np.arange(2, 2 + 21 * 10, dtype=np.uint32), 20, eos_id=1, pad_id=0)
    n = len(seqs)

    def order(seed, steps):
        it = iter(train_dataset(seqs, global_batch=2, seed=seed))
        return [i for _ in range(steps) for i in next(it)["index"].tolist()]

    a, b, c = order(0, n), order(0, n), order(1, n)
    assert a == b and a != c
    assert sorted(a[:n]) == list(range(n)) and sorted(a[n : 2 * n]) == list(range(n))


def test_process_slices_form_the_global_batch():
    seqs = PackedSequences(np.arange(2, 2 + 9 * 40, dtype=np.uint32), 8, eos_id=1, pad_id=0)
    whole = iter(train_dataset(seqs, global_batch=8, seed=3))
    parts = [
        iter(train_dataset(seqs, global_batch=8, seed=3, process_index=p, process_count=4))
        for p in range(4)
    ]
    for _ in range(5):
        global_ids = sorted(next(whole)["index"].tolist())
        local_ids = sorted(i for it in parts for i in next(it)["index"].tolist())
        assert global_ids == local_ids


def test_iterator_state_roundtrip():
    seqs = PackedSequences(np.arange(2, 2 + 9 * 40, dtype=np.uint32), 8, eos_id=1, pad_id=0)
    it = iter(train_dataset(seqs, global_batch=4, seed=0))
    next(it)
    state = it.get_state()
    expected = [next(it)["index"].tolist() for _ in range(3)]
    it2 = iter(train_dataset(seqs, global_batch=4, seed=0))
    it2.set_state(json.loads(json.dumps(state)))
    assert [next(it2)["index"].tolist() for _ in range(3)] == expected


def test_text_sources(tmp_path):
    (tmp_path / "a.txt").write_text("doc one\n<|endoftext|>\ndoc two\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("gz doc")
    with zipfile.ZipFile(tmp_path / "c.zip", "w") as z:
        z.writestr("x.txt", "zip doc")
        z.writestr("y.jsonl", json.dumps({"text": "zip json doc"}) + "\n")
    (tmp_path / "d.jsonl").write_text(
        json.dumps({"body": "j1"}) + "\n\n" + json.dumps({"body": "j2"}) + "\n"
    )
    docs = lambda name, **kw: list(sources.text_documents(tmp_path / name, **kw))
    assert docs("a.txt") == ["doc one\n", "doc two\n"]
    assert docs("b.txt.gz") == ["gz doc"]
    assert docs("c.zip") == ["zip doc", "zip json doc"]
    assert docs("d.jsonl", text_field="body") == ["j1", "j2"]
    with pytest.raises(KeyError, match="text"):
        docs("d.jsonl")
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        docs("nope.txt")
    assert [p.name for p in sources.expand([tmp_path])] == ["a.txt", "b.txt.gz", "c.zip", "d.jsonl"]


def test_shipped_corpora_read():
    dickens = list(sources.text_documents(resolve("dickens/dickens.zip")))
    assert len(dickens) == 1 and len(dickens[0]) > 9_900_000  # CRLF read as LF
    valid = list(sources.text_documents(resolve("gutenberg/gutenberg_valid.txt.gz")))
    assert len(valid) == 3


def test_gpt2_bpe_known_ids():
    tok = GPT2BPE(resolve("gpt2_bpe"))
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.eos_id == 50256 and tok.vocab_size == 50257
    text = "Héllo  world\n\n it's 12345 ünïcode ✓"
    assert tok.decode(tok.encode(text)) == text


def test_gpt2_bpe_from_several_threads():
    """Grain's in-process prefetch calls a source's __getitem__ from a thread pool: encoding
    from several threads at once (the piece table filled in place) gives the serial ids."""
    rng = np.random.default_rng(0)
    texts = [
        " ".join(
            f"{rng.integers(10**6, 10**7)} {WORDS[rng.integers(len(WORDS))]}-" for _ in range(12)
        )
        for _ in range(1200)
    ]
    serial, tok = GPT2BPE(resolve("gpt2_bpe")), GPT2BPE(resolve("gpt2_bpe"))
    want = [serial.encode(t) for t in texts]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(tok.encode, texts))
    assert got == want


def test_sentencepiece_direct_and_through_seqio(sp_model):
    direct = SentencePieceTokenizer(sp_model, use_seqio=False)
    via_seqio = SentencePieceTokenizer(sp_model, use_seqio=True)
    assert via_seqio.backend == "seqio"
    text = "To be, or not to be, that is the question."
    assert direct.encode(text) == via_seqio.encode(text)
    assert via_seqio.decode(via_seqio.encode(text)) == text
    assert direct.vocab_size == 512 and direct.eos_id == 1 and direct.pad_id == 0


def test_trained_tokenizer_is_cached(sp_model, tmp_path_factory):
    again = train_sentencepiece(["unused"], 512, Path(sp_model).parent, key="test")
    assert again == sp_model


def test_arrayrecord_source(tmp_path, sp_model, monkeypatch):
    monkeypatch.setenv("HWH_CACHE_DIR", str(tmp_path / "cache"))
    docs = [[5, 6, 7], [8, 9], list(range(10, 50))]
    path = tmp_path / "tokens.arrayrecord"
    sources.write_arrayrecord_tokens(path, docs)
    assert [d.tolist() for d in sources.arrayrecord_tokens([path])] == docs
    spec = DataSpec(
        source="arrayrecord",
        paths=(str(path),),
        tokenizer="sentencepiece",
        sp_model=str(sp_model),
        heldout_fraction=0.0,
    )
    splits = build_splits(spec, seq_len=7)
    np.testing.assert_array_equal(splits.train.stream, concat_documents(docs, 1))


def test_tfds_source_with_local_dataset(tmp_path, sp_model, monkeypatch):
    import tensorflow_datasets as tfds

    class TinyText(tfds.core.GeneratorBasedBuilder):
        """A three-document text dataset built on the spot (no network)."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()})
            )

        def _split_generators(self, dl_manager):
            return {
                "train": self._generate_examples(["alpha beta", "gamma delta", "epsilon"]),
                "validation": self._generate_examples(["zeta eta"]),
            }

        def _generate_examples(self, texts):
            for i, t in enumerate(texts):
                yield i, {"text": t}

    data = tmp_path / "tfds"
    TinyText(data_dir=str(data), file_format="array_record").download_and_prepare()
    texts = sorted(sources.tfds_documents("tiny_text", "train", data_dir=str(data)))
    assert texts == ["alpha beta", "epsilon", "gamma delta"]
    monkeypatch.setenv("HWH_CACHE_DIR", str(tmp_path / "cache"))
    spec = DataSpec(
        source="tfds",
        paths=(),
        tfds_name="tiny_text",
        tfds_data_dir=str(data),
        tfds_heldout_split="validation",
        tokenizer="sentencepiece",
        sp_model=str(sp_model),
    )
    splits = build_splits(spec, seq_len=4)
    tok = splits.tokenizer
    assert tok.decode([t for t in splits.heldout.stream if t != tok.eos_id]) == "zeta eta"


def test_data_paths_resolve_shipped_first_then_the_users_folder(tmp_path, monkeypatch):
    """Shipped data wins over a user's folder of the same name; a user's own file is found
    through data.data_dir or $HWH_DATA_DIR; an unknown one names every place looked in."""
    from hwh_jax.data.paths import ASSETS

    (tmp_path / "dickens").mkdir()
    (tmp_path / "dickens" / "dickens.zip").write_text("not the shipped one")
    (tmp_path / "mine.txt").write_text("my corpus")
    assert resolve("dickens/dickens.zip", str(tmp_path)) == ASSETS / "dickens" / "dickens.zip"
    assert resolve("mine.txt", str(tmp_path)) == tmp_path / "mine.txt"
    monkeypatch.setenv("HWH_DATA_DIR", str(tmp_path))
    assert resolve("mine.txt") == tmp_path / "mine.txt"
    monkeypatch.delenv("HWH_DATA_DIR")
    with pytest.raises(FileNotFoundError, match=r"mine\.txt.*assets.*data\.data_dir"):
        resolve("mine.txt")
    for name in (
        "dickens/dickens.zip",
        "gutenberg/gutenberg_train.txt.gz",
        "gpt2_bpe/vocab.bpe.gz",
        "pg_essays/PaulGrahamEssays",
        "evals/hellaswag",
        "wikitext2/test.txt.gz",
    ):
        assert (ASSETS / name).exists(), name
    for folder in ASSETS.iterdir():
        if folder.is_dir():
            assert (folder / "PROVENANCE.txt").exists(), f"{folder.name} has no PROVENANCE.txt"


def test_missing_path_is_named():
    with pytest.raises(FileNotFoundError, match="no_such_corpus.txt"):
        DataSpec(paths=("no_such_corpus.txt",)).validate()
    with pytest.raises(ValueError, match="tokenizer"):
        DataSpec(tokenizer="bytes").validate()


@pytest.fixture(scope="module")
def gpt2():
    return GPT2BPE(resolve("gpt2_bpe"))


def test_retrieval_mix_sequences(gpt2):
    stream = np.asarray(gpt2.encode(sources.read_text(SHAKESPEARE)[:60_000]), np.uint32)
    text = PackedSequences(stream, 256, eos_id=gpt2.eos_id, pad_id=gpt2.pad_id)
    mix = RetrievalMix(text, gpt2, 0.25)
    assert mix.num_text == len(text) and mix.num_synthetic == round(len(text) / 3)
    assert len(mix) == len(text) + mix.num_synthetic
    np.testing.assert_array_equal(mix[3]["inputs"], text[3]["inputs"])
    needle_re = r"One of the special magic (numbers|uuids) for (\S+) is: (\S+)\. "
    counts = set()
    for j in range(mix.num_synthetic):
        x = mix[len(text) + j]
        assert int(x["index"]) == len(text) + j
        assert x["inputs"].shape == x["targets"].shape == (256,) and x["loss_mask"].all()
        np.testing.assert_array_equal(x["inputs"][1:], x["targets"][:-1])
        window = np.concatenate([x["inputs"], x["targets"][-1:]])
        doc = gpt2.decode(window.tolist()).split("<|endoftext|>")[0]
        found = re.findall(needle_re, doc)
        kinds = {f[0] for f in found}
        kind = kinds.pop()
        assert len(found) and doc.startswith(f"A special magic {kind[:-1]} is hidden")
        pairs = {key: value for _, key, value in found}
        assert len(pairs) == len(found) and 1 <= len(found) <= 4
        counts.add(len(found))
        asked = re.findall(
            rf"What is the special magic {kind[:-1]} for (\S+) mentioned in the "
            rf"provided text\? The special magic {kind[:-1]} for \1 mentioned in "
            rf"the provided text is (\S+)\.",
            doc,
        )
        assert dict(asked) == pairs  # every needle asked, answered right
        last_needle = max(doc.index(f"for {k} is:") for k in pairs)
        assert last_needle < doc.index("What is the")
        assert all(len(v) == (7 if kind == "numbers" else 36) for v in pairs.values())
    assert counts == {1, 2, 3}  # up to 4 drawn, fewer where 256 tokens cannot hold them
    for j in range(20):  # the probe's masks cover exactly the values
        x, answer, needle = mix.probe(j)
        assert int(answer.sum()) == int(needle.sum()) > 0
        doc = gpt2.decode(np.concatenate([x["inputs"], x["targets"][-1:]]).tolist())
        values = re.findall(needle_re, doc.split("<|endoftext|>")[0])
        for m in (answer, needle):
            picked = gpt2.decode(x["targets"][m > 0].tolist())
            assert sorted(picked.split()) == sorted(v for _, _, v in values), (picked, values)
    again = RetrievalMix(text, gpt2, 0.25, answer_weight=5.0)
    np.testing.assert_array_equal(again[len(text) + 5]["inputs"], mix[len(text) + 5]["inputs"])
    _, answers, _ = mix.probe(5)
    np.testing.assert_array_equal(again[len(text) + 5]["loss_mask"], 1 + 4 * answers)


def test_retrieval_mix_in_another_wording(gpt2):
    """``fmt="pairs"``: no word of RULER's templates, numbers only, every needle asked and
    answered in its own wording; the probe's masks cover the values; the same draws as
    "ruler" would make otherwise (keys, depths)."""
    stream = np.asarray(gpt2.encode(sources.read_text(SHAKESPEARE)[:60_000]), np.uint32)
    text = PackedSequences(stream, 256, eos_id=gpt2.eos_id, pad_id=gpt2.pad_id)
    mix = RetrievalMix(text, gpt2, 0.25, fmt="pairs")
    assert "format pairs" in repr(mix)
    for j in range(mix.num_synthetic):
        x, answer, needle = mix.probe(j)
        doc = gpt2.decode(np.concatenate([x["inputs"], x["targets"][-1:]]).tolist())
        doc = doc.split("<|endoftext|>")[0]
        assert "magic" not in doc and "special" not in doc
        found = dict(re.findall(r"Note: the code of (\S+) is (\d{7})\. ", doc))
        asked = dict(re.findall(r"\nQ: What is the code of (\S+)\?\nA: (\d{7})\.", doc))
        assert found and asked == found, (found, asked)
        for m in (answer, needle):
            picked = gpt2.decode(x["targets"][m > 0].tolist())
            assert sorted(picked.split()) == sorted(found.values())
    with pytest.raises(ValueError, match=r"retrieval format must be one of \['ruler', 'pairs'\]"):
        RetrievalMix(text, gpt2, 0.25, fmt="nope")
    with pytest.raises(ValueError, match="data.retrieval_format must be one of"):
        DataSpec(retrieval_format="nope").validate(files=False)


def test_retrieval_template_is_the_evaluations():
    """One needle: the synthetic pieces around a context are the NIAH prompt + the answer."""
    from hwh_jax.eval import niah

    for task in niah.SINGLE:
        header, [needle], [answer] = RetrievalMix.pieces(
            niah.TASKS[task][1], ["odd-owl"], ["1234567"]
        )
        context = "Haystack one." + needle + "Haystack two."
        assert header + context + answer == niah.render(task, context, "odd-owl") + " 1234567."


def test_retrieval_mix_share_in_batches_and_errors(gpt2):
    stream = np.asarray(gpt2.encode(sources.read_text(SHAKESPEARE)[:60_000]), np.uint32)
    text = PackedSequences(stream, 256, eos_id=gpt2.eos_id, pad_id=gpt2.pad_id)
    mix = RetrievalMix(text, gpt2, 0.2)
    it = iter(train_dataset(mix, global_batch=16, seed=0))
    ids = np.concatenate([next(it)["index"] for _ in range(len(mix) // 16)])
    assert abs(np.mean(ids >= len(text)) - 0.2) < 0.05
    with pytest.raises(ValueError, match="share"):
        RetrievalMix(text, gpt2, 1.0)
    with pytest.raises(ValueError, match="seq_len 64 is too short.*template"):
        RetrievalMix(PackedSequences(stream, 64, eos_id=gpt2.eos_id, pad_id=0), gpt2, 0.2)
    with pytest.raises(ValueError, match="retrieval_share"):
        DataSpec(retrieval_share=-0.1).validate()
    with pytest.raises(
        ValueError, match="retrieval_answer_weight must be a finite number >= 1, got 0.5"
    ):
        DataSpec(retrieval_answer_weight=0.5).validate()
    with pytest.raises(ValueError, match="retrieval_max_needles must be an integer >= 1, got 0"):
        DataSpec(retrieval_max_needles=0).validate()


@pytest.mark.parametrize("module", ["hwh_jax.data.retrieval", "hwh_jax.eval.retrieval_probe"])
def test_imports_alone_without_a_cycle(module):
    """eval.retrieval_probe uses data.retrieval (and the eval package imports the probe): each
    must import first, in a fresh interpreter."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("which", ["gpt2", "sentencepiece"])
def test_retrieval_pieces_encode_as_the_whole_texts(which, gpt2, sp_model):
    """RetrievalMix encodes each needle / answer as (template before the value, cached) + (value
    chunk): for both tokenizers that equals encoding the whole text, and the value span holds
    exactly the value's tokens."""
    tok = gpt2 if which == "gpt2" else SentencePieceTokenizer(sp_model, use_seqio=False)
    stream = np.asarray(tok.encode(sources.read_text(SHAKESPEARE)[:20_000]), np.uint32)
    mix = RetrievalMix(PackedSequences(stream, 512, eos_id=tok.eos_id, pad_id=0), tok, 0.5)
    rng = np.random.default_rng(0)
    for fmt, kind, value in [
        ("ruler", "numbers", "1234567"),
        ("ruler", "numbers", "9000001"),
        ("ruler", "uuids", "3f2a9c1e-0b4d-4e8f-9a7b-1c2d3e4f5a6b"),
        ("ruler", "uuids", "a1b2c3d4-0000-4fff-8abc-ffffffffffe0"),
        ("pairs", "numbers", "1234567"),
        ("pairs", "numbers", "9000001"),
    ]:
        mix.fmt = fmt
        keys = [WORDS[int(i)] for i in rng.choice(len(WORDS), 3, replace=False)]
        values = [value] * 3
        header, needles, answers, n_spans, a_spans = mix._encode(kind, keys, values)
        h, n_texts, a_texts = RetrievalMix.pieces(kind, keys, values, fmt)
        assert header.tolist() == tok.encode(h)
        for got, text, (lo, hi) in zip(needles + answers, n_texts + a_texts, n_spans + a_spans):
            assert got.tolist() == tok.encode(text), text
            assert tok.decode(got[lo:hi].tolist()).strip() == value


def test_worker_processes_give_the_same_batches_and_resume(gpt2):
    """data.workers > 0 builds batches in grain worker processes: the same batches in the same
    order as in-process, and a checkpointed iterator state resumes where it stopped."""
    stream = np.asarray(gpt2.encode(sources.read_text(SHAKESPEARE)[:60_000]), np.uint32)

    def mix():
        return RetrievalMix(PackedSequences(stream, 256, eos_id=gpt2.eos_id, pad_id=0), gpt2, 0.25)

    ref = iter(train_dataset(mix(), global_batch=8, seed=3))
    want = [next(ref) for _ in range(6)]
    it = iter(train_dataset(mix(), global_batch=8, seed=3, workers=2))
    got = [next(it) for _ in range(3)]
    state = it.get_state()
    assert len(state["iterators_in_use_indices"]) == 2  # two worker processes' states
    again = iter(train_dataset(mix(), global_batch=8, seed=3, workers=2))
    again.set_state(state)
    got += [next(again) for _ in range(3)]
    for a, b in zip(want, got):
        for key in ("inputs", "loss_mask", "index"):
            np.testing.assert_array_equal(a[key], b[key])
    with pytest.raises(ValueError, match="data.workers must be an integer >= 0, got -1"):
        DataSpec(workers=-1).validate()
