"""Evaluation suite: NIAH generator and scorer, MQAR invariants, eval files, log-likelihoods."""

import json
import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hwh_jax.data import ruler
from hwh_jax.data.paths import resolve
from hwh_jax.data.sources import read_text
from hwh_jax.data.tokenizers import GPT2BPE
from hwh_jax.eval import commonsense, mqar, niah
from hwh_jax.eval.scoring import Scorer
from hwh_jax.models import HybridLM, model_config


@pytest.fixture(scope="module")
def gpt2():
    return GPT2BPE(resolve("gpt2_bpe"))


@pytest.mark.parametrize("task", niah.SINGLE)
@pytest.mark.parametrize("length", [512, 2048])
def test_niah_prompt_follows_ruler_template_length_and_depth(gpt2, task, length):
    new = 16
    for depth in (0, 50, 100):
        s = niah.make_sample(task, length, depth, gpt2, max_new_tokens=new, seed=1)
        n = len(gpt2.encode(s.prompt))
        kept = niah.TOKENS_TO_GENERATE  # RULER's generation budget
        assert n == s.prompt_tokens and length - kept - 40 <= n <= length - kept, n
        kind = niah.TASKS[task][1]
        one = kind[:-1]
        m = re.fullmatch(
            rf"A special magic {one} is hidden within the following text\. Make sure to "
            rf"memorize it\. I will quiz you about the {one} afterwards\.\n(.*)\nWhat is "
            rf"the special magic {one} for ([a-z]+-[a-z]+) mentioned in the provided text\? The "
            rf"special magic {one} for \2 mentioned in the provided text is",
            s.prompt,
            flags=re.S,
        )
        assert m, s.prompt[:200]
        context, key = m.group(1), m.group(2)
        needle = f"One of the special magic {kind} for {key} is: {s.expected[0]}."
        assert context.count(needle) == 1
        value = s.expected[0]
        if kind == "numbers":
            assert re.fullmatch(r"[1-9]\d{6}", value)
        else:
            assert re.fullmatch(
                r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-"
                r"[0-9a-f]{12}",
                value,
            )
        at = context.index(needle) / max(len(context) - len(needle), 1)
        assert abs(at - depth / 100) < 0.1, (depth, at)
        if niah.TASKS[task][0] == "noise":
            assert set(context.replace(needle, "").split("\n")) <= {niah.NOISE, ""}
        elif depth == 100:  # after the (word-truncated) haystack, as in RULER
            assert context.endswith(needle)
        else:  # at a sentence boundary of the essays
            before = context[: context.index(needle)].rstrip()
            assert before == "" or before[-1] in ".!?\"')]", before[-30:]


def test_niah_renders_rulers_strings():
    """RULER's niah.py for one key and one value (num_needle_q * num_needle_v == 1) turns its
    plural template singular; these are the strings it renders for fixed keys and values."""
    assert niah.render("niah_single_2", "CONTEXT", "lucky-anchor") == (
        "A special magic number is hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the number afterwards.\nCONTEXT\nWhat is the special magic "
        "number for lucky-anchor mentioned in the provided text? The special magic number for "
        "lucky-anchor mentioned in the provided text is"
    )
    assert niah.render("niah_single_3", "CONTEXT", "odd-owl") == (
        "A special magic uuid is hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the uuid afterwards.\nCONTEXT\nWhat is the special magic uuid "
        "for odd-owl mentioned in the provided text? The special magic uuid for odd-owl "
        "mentioned in the provided text is"
    )
    # several values asked: RULER's plural template, untouched
    assert ruler.prompt_template(2).format(
        type_needle_v="numbers", context="C", query="a, and b"
    ) == (
        "Some special magic numbers are hidden within the following text. Make sure to "
        "memorize it. I will quiz you about the numbers afterwards.\nC\nWhat are all the "
        "special magic numbers for a, and b mentioned in the provided text? The special "
        "magic numbers for a, and b mentioned in the provided text are"
    )
    assert (
        niah.NEEDLE.format(type_needle_v="numbers", key="k", value="1234567")
        == "One of the special magic numbers for k is: 1234567."
    )


def test_essays_repeat_for_a_longer_haystack(gpt2, tmp_path):
    """RULER concatenates the essays and repeats them when a longer haystack is needed."""
    (tmp_path / "a.txt").write_text("Alpha beta gamma delta. Epsilon zeta eta theta. " * 20)
    words = niah.essay_words(str(tmp_path))
    s = niah.make_sample(
        "niah_single_2", 2048, 50, gpt2, max_new_tokens=16, essay_folder=str(tmp_path)
    )
    assert s.prompt.count("Epsilon zeta eta theta.") > 2 * 20  # repeated, not refused
    assert s.prompt_tokens <= 2048 - niah.TOKENS_TO_GENERATE and len(words) == 160


def test_niah_rejects_bad_requests(gpt2):
    with pytest.raises(ValueError, match="no room"):
        niah.make_sample("niah_single_2", 60, 50, gpt2, max_new_tokens=16)
    with pytest.raises(ValueError, match="depth"):
        niah.make_sample("niah_single_2", 600, 150, gpt2, max_new_tokens=16)
    with pytest.raises(ValueError, match="unknown NIAH task"):
        niah.make_sample("niah_multi", 600, 50, gpt2, max_new_tokens=16)


def test_string_match_all():
    assert niah.string_match_all(" 1234567.", ["1234567"]) == 100.0
    assert niah.string_match_all("The number is 1234.", ["1234567"]) == 0.0
    assert niah.string_match_all("AB-cd and 9", ["ab-CD", "8"]) == 50.0


def test_mqar_generator_invariants():
    b = mqar.multiquery_ar(8192, 16, 256, 16, seed=3)
    assert b.inputs.shape == b.labels.shape == (16, 256)
    for x, y in zip(b.inputs, b.labels):
        keys, values = x[0:32:2], x[1:32:2]
        assert (keys >= 1).all() and (keys < 4096).all() and len(set(keys)) == 16
        assert (values >= 4096).all() and len(set(values)) == 16
        q = np.nonzero(y != mqar.IGNORE)[0]
        assert len(q) == 16 and (q >= 32).all()
        kv = dict(zip(keys.tolist(), values.tolist()))
        for t in q:  # the input at a query position is a key; its label is that key's value
            assert y[t] == kv[int(x[t])]
    again = mqar.multiquery_ar(8192, 16, 256, 16, seed=3)
    assert (again.inputs == b.inputs).all()
    with pytest.raises(ValueError, match="pairs need"):
        mqar.multiquery_ar(8192, 4, 64, 32)
    small = mqar.multiquery_ar(512, 4, 64, 4, seed=0)
    onehot = np.eye(512)[np.where(small.labels == mqar.IGNORE, 0, small.labels)]
    assert mqar.mqar_accuracy(onehot, small.labels) == 1.0
    assert mqar.mqar_accuracy(np.roll(onehot, 1, axis=-1), small.labels) == 0.0


@pytest.mark.parametrize("task", commonsense.TASKS)
def test_every_eval_example_loads(task):
    expected = {
        "arc_easy": 2376,
        "arc_challenge": 1172,
        "piqa": 1838,
        "openbook_qa": 500,
        "hellaswag": 10042,
        "winogrande": 1267,
        "lambada_openai": 5153,
    }[task]
    rows = commonsense.load_task(task)
    assert len(rows) == expected
    for r in rows:
        if task == "winogrande":
            assert len(r["contexts"]) == 2 and r["continuation"].strip()
        elif task == "lambada_openai":
            assert r["context"] and r["continuation"].strip() and " " not in r["continuation"][1:]
        else:
            assert r["context"] and len(r["choices"]) >= 2 and all(c.strip() for c in r["choices"])
    if task == "hellaswag":
        tag = re.compile(r"\[[a-z]+\]")  # [title], [header], [step]: removed as the harness does
        assert not any(tag.search(c) for r in rows for c in r["choices"] + [r["context"]])


def test_split_encode_keeps_the_whole(gpt2):
    ctx, cont = commonsense.split_encode(gpt2, "Question: why?\nAnswer:", " because")
    assert gpt2.decode(ctx + cont) == "Question: why?\nAnswer: because"
    assert gpt2.decode(cont) == " because"


def test_loglikelihood_equals_brute_force_sum():
    model = HybridLM(model_config("hwh", "tiny", dtype="float32", vocab_size=128), rngs=nnx.Rngs(0))
    scorer = Scorer(model, batch_size=4, bucket=16)
    rng = np.random.default_rng(0)
    reqs = [
        (rng.integers(1, 128, n).tolist(), rng.integers(1, 128, m).tolist())
        for n, m in [(5, 3), (20, 1), (2, 7)]
    ]
    got = scorer.loglikelihood(reqs)
    fwd = nnx.jit(lambda m, x: m(x))
    for (ctx, cont), (lp, greedy) in zip(reqs, got):
        whole = jnp.asarray([ctx + cont + [0] * (32 - len(ctx) - len(cont))])  # one shape
        logp = np.asarray(jax_log_softmax(fwd(model, whole)))[0]
        ref = sum(logp[len(ctx) - 1 + i, cont[i]] for i in range(len(cont)))
        assert abs(lp - ref) < 1e-4 * abs(ref)
        assert greedy == all(
            int(np.argmax(logp[len(ctx) - 1 + i])) == cont[i] for i in range(len(cont))
        )


def jax_log_softmax(x):
    import jax

    return jax.nn.log_softmax(x, axis=-1)


def test_report_keeps_runs_cut_before_their_evaluation(tmp_path):
    """A run without eval/results.json is tabulated from its metrics, not dropped."""
    from hwh_jax.experiments.report import report

    run = tmp_path / "cut"
    run.mkdir()
    rows = [{"step": s, "split": "train", "loss": 10.0 - s / 10} for s in range(1, 61)]
    rows += [
        {"step": 60, "split": "heldout", "loss": 4.5},
        {"step": 30, "split": "perf", "tokens_per_s": 5.0},
        {"step": 60, "split": "perf", "tokens_per_s": 7.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = report([run], tmp_path / "rep")
    mean_last_50 = sum(10.0 - s / 10 for s in range(11, 61)) / 50
    assert f"| cut | 60 | - | {mean_last_50:.4f} (last 50) | 4.5000 | 7 | no (cut short) |" in text
    assert "NIAH" not in text  # no finished run: no NIAH table
    exps = json.loads((tmp_path / "rep" / "experiments.json").read_text())
    assert exps[0]["closing_eval"] is False and exps[0]["steps"] == 60
    assert (tmp_path / "rep" / "train_loss.png").exists()
    short = tmp_path / "short"
    short.mkdir()
    (short / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    assert "| short | 4 |" in report([run, short], tmp_path / "rep3")  # fewer steps than smoothing
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        report([tmp_path / "empty"], tmp_path / "rep2")


class _FixedScorer:
    """Stands in for Scorer: every token gets log-prob ``lp``; greedy right or wrong."""

    batch_size = 8

    def __init__(self, lp, right):
        self.lp, self.right, self.calls = lp, right, 0

    def token_logprobs(self, tokens):
        self.calls += 1
        shape = (tokens.shape[0], tokens.shape[1] - 1)
        return np.full(shape, self.lp, np.float32), np.full(shape, self.right)


def test_retrieval_probe_aggregates_answers_and_needles():
    from hwh_jax.eval.retrieval_probe import retrieval_probe

    tok = GPT2BPE(resolve("gpt2_bpe"))
    stream = np.asarray(
        tok.encode(read_text(resolve("tinyshakespeare/input.txt.gz"))[:40_000]), np.uint32
    )
    right = _FixedScorer(-0.5, True)
    out = retrieval_probe(right, tok, stream, 256, num=10, log=lambda *_: None)
    assert right.calls == 2 and out["documents"] == 10 and out["answers"] >= 10
    assert out["exact"] == 1.0 and out["answer_accuracy"] == out["needle_accuracy"] == 1.0
    assert out["answer_nll"] == pytest.approx(0.5) and out["needle_nll"] == pytest.approx(0.5)
    assert (
        retrieval_probe(_FixedScorer(-2.0, False), tok, stream, 256, num=3, log=lambda *_: None)[
            "exact"
        ]
        == 0.0
    )
    with pytest.raises(ValueError, match="num must be"):
        retrieval_probe(right, tok, stream, 256, num=0)


def test_retrieval_probe_reads_the_trained_wording_beside_niahs(gpt2, tmp_path):
    """A model trained on another wording of the synthetic documents (data.retrieval_format) is
    probed in NIAH's wording ("retrieval") and in its own ("retrieval_trained_format"), whose
    documents are that wording's; a model of NIAH's wording is probed once."""
    from hwh_jax.eval.retrieval_probe import retrieval_probe
    from hwh_jax.eval.suite import EvalModel, EvalSpec, run_suite

    stream = np.asarray(
        gpt2.encode(read_text(resolve("tinyshakespeare/input.txt.gz"))[:40_000]), np.uint32
    )
    seen = {}
    for fmt in ("ruler", "pairs"):

        class Recording(_FixedScorer):
            def token_logprobs(self, tokens, fmt=fmt):
                seen.setdefault(fmt, tokens)
                return super().token_logprobs(tokens)

        out = retrieval_probe(Recording(-1.0, True), gpt2, stream, 256, num=4, fmt=fmt, log=print)
        assert out["format"] == fmt and out["answers"] >= 4
    assert "Note: the code of" in gpt2.decode(seen["pairs"][0].tolist())
    assert "Note: the code of" not in gpt2.decode(seen["ruler"][0].tolist())
    cfg = model_config("transformer", "tiny", dtype="float32", vocab_size=gpt2.vocab_size)
    model = HybridLM(cfg, rngs=nnx.Rngs(0))
    spec = EvalSpec(suites=("retrieval",), retrieval_documents=4, batch_size=4)
    for fmt, keys in (("pairs", {"retrieval", "retrieval_trained_format"}), ("ruler", set())):
        subject = EvalModel(model, gpt2, 256, "m@x", heldout=stream, retrieval_format=fmt)
        res = run_suite(subject, spec, tmp_path / fmt, log=lambda *_: None)
        got = {k for k in res if k.startswith("retrieval")}
        assert got == (keys or {"retrieval"}), got
        assert res["retrieval"]["format"] == "ruler"
        if fmt == "pairs":
            assert res["retrieval_trained_format"]["format"] == "pairs"
            taught = res
    from hwh_jax.experiments.report import run_table

    row = dict(name="m", arch="transformer", params=1e6, tokens=1e6, heldout_loss=3.0, mqar={})
    row.update(tokens_per_s=None, mfu=None, wall_s=1.0, retrieval=taught["retrieval"])
    assert "wording" not in run_table([row])
    row["retrieval_trained"] = taught["retrieval_trained_format"]
    assert "; its pairs wording " in run_table([row])


def test_an_evaluation_cut_during_niah_keeps_what_it_measured(gpt2, tmp_path):
    """results.json is rewritten after every suite and NIAH length: an evaluation killed during
    2L (a job's time limit) leaves L's scores, marked unfinished, and the report shows
    them with "-" for the rest and the run as partial."""
    from hwh_jax.eval.suite import EvalModel, EvalSpec, run_suite
    from hwh_jax.experiments.report import report

    cfg = model_config("transformer", "tiny", dtype="float32", vocab_size=gpt2.vocab_size)
    run = EvalModel(
        HybridLM(cfg, rngs=nnx.Rngs(0)),
        gpt2,
        256,
        "cut@x",
        arch=cfg.arch,
        step=3,
        workdir=str(tmp_path),
    )
    spec = EvalSpec(
        suites=("niah",), niah_factors=(1, 2), niah_depths=1, niah_samples=2, batch_size=4
    )

    class TimeLimit(Exception):
        pass

    def log(line):
        if "@ 512" in line:
            raise TimeLimit(line)

    with pytest.raises(TimeLimit):
        run_suite(run, spec, tmp_path / "eval", log=log)
    res = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert res["finished"] is False
    assert set(res["niah_summary"]) == {f"{t}@256" for t in niah.SINGLE}
    assert {r["length"] for r in res["niah"]} == {256}
    assert {k: v["n"] for k, v in res["niah_intervals"].items()} == {
        f"{t}@256": 2 for t in niah.SINGLE
    }
    assert all(0 <= v["lo"] <= v["hi"] <= 100 for v in res["niah_intervals"].values())
    res["niah_summary"] |= {f"{t}@512": 0.0 for t in niah.SINGLE}  # a finished run's keys
    done = tmp_path / "done"
    (done / "eval").mkdir(parents=True)
    (done / "eval" / "results.json").write_text(json.dumps(res | {"finished": True}))
    summary = {
        "arch": "transformer",
        "params": 1,
        "steps": 3,
        "tokens": 3,
        "wall_s": 1.0,
        "devices": "1 x cpu",
        "final_heldout_loss": 5.0,
    }
    metrics = "".join(
        json.dumps({"step": s, "split": "train", "loss": 6.0}) + "\n" for s in (1, 2, 3)
    )
    for d in (tmp_path, done):
        (d / "summary.json").write_text(json.dumps(summary))
        (d / "metrics.jsonl").write_text(metrics)
    text = report([tmp_path, done], tmp_path / "rep")
    row = next(line for line in text.splitlines() if line.startswith(f"| {tmp_path.name} | "))
    assert row.count(" - ") == 3  # 512 of the three tasks: not measured
    assert "partial (cut during it)" in text and "| 3 | - | 6.0000 (last 3) | - | - | yes |" in text


@pytest.mark.parametrize("right,n", [(0, 10), (5, 10), (10, 10), (37, 100), (1, 3)])
def test_wilson_interval_is_the_score_tests_acceptance_region(right, n):
    """Wilson's interval = the p whose score test |p_hat - p| <= z sqrt(p (1 - p) / n) accepts
    the observed share: found here by scanning p, against the closed form."""
    from hwh_jax.eval import stats

    lo, hi = stats.wilson(right, n)
    p = np.linspace(0, 1, 200_001)
    accepted = p[np.abs(right / n - p) <= stats.Z95 * np.sqrt(p * (1 - p) / n)]
    assert abs(lo - accepted.min()) < 1e-4 and abs(hi - accepted.max()) < 1e-4
    cell = stats.share([100.0] * right + [0.0] * (n - right))
    assert (cell["n"], cell["right"]) == (n, right)
    assert abs(cell["lo"] - 100 * lo) < 1e-9 and abs(cell["mean"] - 100 * right / n) < 1e-9


def test_none_or_all_right_has_exact_bounds():
    """0 of n: the lower bound is 0 exactly (the closed form gave 5.6e-15 in summary.json);
    n of n: the upper 1; the other bound z^2 / (n + z^2)."""
    from hwh_jax.eval import stats

    z2 = stats.Z95**2
    assert stats.wilson(0, 3) == (0.0, z2 / (3 + z2))
    assert stats.wilson(9, 9) == (1.0 - z2 / (9 + z2), 1.0)
    assert stats.share([0.0] * 3)["lo"] == 0.0


def test_bootstrap_interval_of_a_mean():
    from hwh_jax.eval import stats

    assert stats.bootstrap_mean([3.0, 3.0, 3.0]) == (3.0, 3.0, 3.0)
    mean, lo, hi = stats.bootstrap_mean(np.random.default_rng(0).normal(10, 1, 400))
    assert lo < mean < hi and 0.15 < hi - lo < 0.25  # ~ 2 x 1.96 / sqrt(400) = 0.196


def test_longppl_short_contexts_key_tokens_and_the_suite(tmp_path):
    """Each token's short-context log-prob is the model's from exactly the context the module
    documents (all of it below ``short``; then short - stride + 1 .. short tokens, scored as a
    sequence of its own); key tokens and LongPPL from constructed log-probs; the suite writes
    its result and figure, with the model as its own evaluator or another one."""
    from hwh_jax.eval import longppl
    from hwh_jax.eval.suite import EvalModel, EvalSpec, run_suite

    model = HybridLM(
        model_config("transformer", "tiny", dtype="float32", vocab_size=128), rngs=nnx.Rngs(0)
    )
    scorer = Scorer(model, batch_size=4)
    rng = np.random.default_rng(0)
    L, short, stride = 24, 8, 4
    windows = rng.integers(1, 128, (2, L + 1)).astype(np.int32)
    got = longppl.short_context_logprobs(scorer, windows, short=short, stride=stride)
    assert np.allclose(
        got[:, :short], longppl.window_logprobs(scorer, windows)[:, :short], atol=1e-5
    )
    for p in (short, short + stride - 1, short + stride, L - 1):  # every sub-window's edge
        s = stride * ((p - short) // stride + 1)
        assert short - stride < p - s + 1 <= short
        alone = longppl.window_logprobs(scorer, windows[:, s : p + 2])[:, -1]
        assert np.allclose(got[:, p], alone, atol=1e-5), p
    long_lp = np.array([[-0.1, -1.0, -5.0, -0.5]])
    short_lp = np.array([[-3.0, -1.5, -9.0, -2.6]])
    assert longppl.key_tokens(long_lp, short_lp).tolist() == [[True, False, False, True]]

    stream = rng.integers(1, 128, 2000).astype(np.int32)
    subject = EvalModel(
        model,
        type("Tok", (), {"name": "t", "eos_id": 0, "pad_id": 0, "vocab_size": 128})(),
        32,
        "m",
        heldout=stream,
    )
    spec = EvalSpec(suites=("longppl",), longppl_factor=2, longppl_windows=3, batch_size=4)
    said = []
    res = run_suite(subject, spec, tmp_path / "self", log=said.append)["longppl"]
    assert res["tokens"] == 3 * 64 and res["evaluator"] == "m" and res["short"] == 32
    line = next(s for s in said if s.startswith("LongPPL"))  # a random model: no key token
    assert (res["key_tokens"] == 0) == line.startswith("LongPPL undefined: no key token"), line
    assert f"at most {res['max_gain']:.2f} nats" in line or res["key_tokens"] > 0, line
    assert sum(r["key_tokens"] for r in res["by_position"]) == res["key_tokens"]
    assert (tmp_path / "self" / "longppl.png").exists()
    other = HybridLM(
        model_config("transformer", "tiny", dtype="float32", vocab_size=128), rngs=nnx.Rngs(1)
    )
    judge = EvalModel(other, subject.tokenizer, 32, "judge")
    res = run_suite(subject, spec, tmp_path / "judged", evaluator=judge)["longppl"]
    assert res["evaluator"] == "judge" and res["tokens"] == 3 * 64
    judge.tokenizer = type("Tok", (), {"name": "other"})()
    with pytest.raises(ValueError, match="tokenizer"):
        run_suite(subject, spec, tmp_path / "bad", evaluator=judge)


def test_extrapolation_chart_pools_the_seeds_of_an_architecture(tmp_path):
    from hwh_jax.eval import plots

    assert plots.seed_groups(["hwh@seed0", "gdn", "hwh@seed1", "swa/seed2", "hwh_seed"]) == {
        "hwh": ["hwh@seed0", "hwh@seed1"],
        "gdn": ["gdn"],
        "swa": ["swa/seed2"],
        "hwh_seed": ["hwh_seed"],
    }
    rows = lambda score: [
        {"task": t, "length": L, "depth": d, "score": score}
        for t in ("niah_single_1", "niah_single_2")
        for L in (64, 128)
        for d in (0, 50)
    ]
    plots.extrapolation_chart(
        {"a@seed0": rows(1.0), "a@seed1": rows(0.0), "b": rows(0.5)},
        tmp_path / "x.png",
        train_len=64,
    )
    assert (tmp_path / "x.png").stat().st_size > 10_000


def test_perplexity_by_position_has_an_interval_over_windows():
    """ppl_by_position against a brute-force count: a scorer whose loss is known per window
    and position; the interval is the windows' mean loss +- 1.96 standard errors."""
    import math

    import numpy as np

    from hwh_jax.eval.perplexity import ppl_by_position

    class Known:
        batch_size = 2

        def token_logprobs(self, tokens):  # loss = the window's first token / 10
            lp = -np.repeat(tokens[:, :1] / 10.0, tokens.shape[1] - 1, axis=1)
            return lp, None

    stream = np.repeat(np.array([10, 20, 30, 40, 50]), 8)  # 5 windows of 8 (+1)
    rows = ppl_by_position(Known(), stream, max_len=8, bucket=4, max_windows=4, log=lambda _: 0)
    losses = np.array([1.0, 2.0, 3.0, 4.0])  # windows start at 0, 8, 16, 24
    half = 1.96 * losses.std(ddof=1) / 2
    assert len(rows) == 2 and all(r["windows"] == 4 for r in rows)
    for r in rows:
        assert math.isclose(r["loss"], 2.5) and math.isclose(r["ppl"], math.exp(2.5))
        assert math.isclose(r["ppl_lo"], math.exp(2.5 - half))
        assert math.isclose(r["ppl_hi"], math.exp(2.5 + half))


def test_each_seed_is_asked_its_own_niah_prompts(gpt2):
    """Runs of different seeds draw different keys and values (independent prompts across
    seeds); seed 0 keeps the prompts of before (sample index as the seed)."""
    from hwh_jax.eval import niah

    def prompts(run_seed):
        return [
            niah.make_sample(
                "niah_single_2", 300, d, gpt2, max_new_tokens=16, seed=niah.prompt_seed(run_seed, s)
            ).prompt
            for d in (0, 50, 100)
            for s in range(3)
        ]

    before = [
        niah.make_sample("niah_single_2", 300, d, gpt2, max_new_tokens=16, seed=s).prompt
        for d in (0, 50, 100)
        for s in range(3)
    ]
    assert prompts(0) == before
    assert prompts(1) == prompts(1)
    assert not set(prompts(1)) & set(prompts(0)) and not set(prompts(1)) & set(prompts(2))


def test_niah_by_depth_from_the_committed_runs():
    """depth_table against a direct count, on the committed 3-seed runs: at 4L the layer-wise
    hybrid answers none of the 63 prompts at depth 0% (every task and seed together)."""
    import json
    from pathlib import Path

    from hwh_jax.experiments.report import depth_table

    root = Path(__file__).resolve().parents[2] / "measurements" / "experiment_L512_per_seed_prompts"
    rows = [
        r
        for s in range(3)
        for r in json.loads(
            (root / "layerwise" / f"seed{s}" / "eval" / "results.json").read_text()
        )["niah"]
    ]
    table = depth_table({"layerwise": rows})
    line = next(l for l in table.splitlines() if l.startswith("| layerwise | 2048 |"))
    cells = [c.strip() for c in line.strip("|").split("|")][2:]
    depths = sorted({r["depth"] for r in rows})
    for d, cell in zip(depths, cells):
        at = [r for r in rows if r["length"] == 2048 and r["depth"] == d]
        assert cell == f"{sum(r['score'] >= 100 for r in at)}/{len(at)}"
    assert cells[0] == "0/63"


def test_commonsense_table_from_the_committed_runs():
    """commonsense_table against a direct computation on the committed HwH / HwH-RoPE runs: a
    cell is the seeds' mean, range and t interval; chance is 1 / choices over the items scored
    (25.0 for ARC's first 500, whose items all have four choices, 50.0 for PIQA)."""
    import json
    import statistics
    from pathlib import Path

    from hwh_jax.eval.stats import seeds_interval
    from hwh_jax.experiments.report import commonsense_table

    root = Path(__file__).resolve().parents[2] / "measurements"
    root = root / "experiment_L512_rope_commonsense"
    rows = {
        a: [
            json.loads((root / a / f"seed{s}" / "eval" / "results.json").read_text())["commonsense"]
            for s in range(3)
        ]
        for a in ("hwh", "hwh_rope")
    }
    table = commonsense_table(rows).splitlines()
    assert table[0] == "| task | metric | examples | chance | hwh | hwh_rope |"
    for task, metric, chance in (("piqa", "acc", "50.0"), ("hellaswag", "acc_norm", "25.0")):
        line = next(l for l in table if l.startswith(f"| {task} | {metric} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2:4] == ["500", chance]
        for cell, runs in zip(cells[4:], rows.values()):
            vals = [100 * r[task][metric] for r in runs]
            lo, hi = seeds_interval(vals)
            want = f"{statistics.mean(vals):.1f} ({min(vals):.1f}-{max(vals):.1f}"
            assert cell == want + f"; t {lo:.1f}-{hi:.1f})"
    assert not any(l.startswith("| winogrande | acc_norm") for l in table)  # not measured


@pytest.mark.parametrize("task", [t for t in niah.TASKS if t not in niah.SINGLE])
def test_ruler_multi_needle_variants(gpt2, task):
    """The multi-key, -value and -query tasks as RULER's niah.py renders them: k needles
    planted (v values each), q keys asked in "K1, K2, and K3" form with the plural template
    when more than one value is asked, every asked value expected; a "needle" haystack is
    distractor needles only, none with a planted key; the first asked needle at the depth."""
    spec = niah.TASKS[task]
    for depth in (0, 50, 100):
        s = niah.make_sample(task, 1024, depth, gpt2, max_new_tokens=64, seed=3)
        assert len(s.expected) == spec.q * spec.v and len(set(s.expected)) == len(s.expected)
        assert s.prompt_tokens <= 1024 - niah.TOKENS_TO_GENERATE
        plural = spec.q * spec.v > 1
        head = "Some special magic numbers are" if plural else "A special magic"
        assert s.prompt.startswith(head), s.prompt[:60]
        asked = re.search(r"for (.*) mentioned in the provided text\?", s.prompt).group(1)
        keys = re.split(r", and |, ", asked)
        assert len(keys) == spec.q
        planted = re.findall(r"One of the special magic \w+ for (\S+) is: (\S+)\.", s.prompt)
        values_of = {}
        for k, v in planted:
            values_of.setdefault(k, []).append(v)
        assert sorted(v for k in keys for v in values_of[k]) == sorted(s.expected)
        if spec.haystack == "needle":
            context = s.prompt.split("\n")[1:-1]
            assert all(line.startswith("One of the special magic") for line in context)
            assert len(context) > 10 and len(set(keys) & {k for k, _ in planted}) == spec.q
            assert sum(k in keys for k, _ in planted) == spec.q * spec.v  # no duplicate keys
        else:
            assert len(planted) == spec.k * spec.v
        first = f"One of the special magic {spec.value} for {keys[0]} is: {s.expected[0]}."
        body = s.prompt[s.prompt.index("\n") : s.prompt.rindex("\n")]
        at = body.index(first) / max(len(body) - len(first), 1)
        assert abs(at - depth / 100) < 0.12, (depth, at)
    assert niah.answer_budget(["niah_single_1"]) == 16 and niah.answer_budget(niah.SINGLE) == 48
    assert niah.answer_budget(["niah_multivalue"]) == 64


def test_seed_level_interval_and_rank_test():
    """The seed as the unit: the t interval of three seeds' mean (t(2) = 4.303), and the exact
    rank test: three seeds all above three others is p = 1/20."""
    from hwh_jax.eval import stats

    lo, hi = stats.seeds_interval([65.0, 71.0, 86.0])
    half = 4.302652729911275 * np.std([65.0, 71.0, 86.0], ddof=1) / np.sqrt(3)
    assert np.isclose(lo, 74.0 - half) and np.isclose(hi, 74.0 + half)
    assert stats.seeds_interval([50.0]) is None
    assert stats.all_above_p([65, 71, 86], [3, 22, 29]) == 1 / 20
    assert stats.all_above_p([65, 71, 86], [3, 22, 66]) == 1.0
    assert stats.all_above_p([9, 8], [1, 2, 3, 4]) == 1 / 15


def test_report_draws_every_run_of_every_group_under_its_own_name(tmp_path, monkeypatch):
    """Two groups whose runs carry one model name (hwh_flat's results say "hwh@seedN", as
    HwH's do): the NIAH figure gets every run of both groups, each with its own prompts'
    results, and the tables name each group."""
    from pathlib import Path

    from hwh_jax.eval import suite
    from hwh_jax.experiments import report as rep

    root = Path(__file__).resolve().parents[2] / "measurements" / "experiment_L512_per_seed_prompts"
    drawn = {}
    monkeypatch.setattr(
        suite.plots, "extrapolation_chart", lambda rows, path, L: drawn.update(rows)
    )
    text = rep.report([root / "hwh", root / "hwh_flat"], tmp_path)
    names = [f"{g}/seed{s}" for g in ("hwh", "hwh_flat") for s in range(3)]
    assert sorted(drawn) == sorted(names)
    for name in names:
        results = json.loads((root / name / "eval" / "results.json").read_text())
        assert drawn[name] == results["niah"], name
    assert drawn["hwh/seed0"] != drawn["hwh_flat/seed0"]
    assert "| hwh |" in text and "| hwh_flat |" in text
