"""lm-evaluation-harness: the project's model "hwh" asks the scorer what the in-house suite
asks it, on the shipped tasks written as harness YAML; the exported PyTorch model under the
harness's own "hf" model agrees with it; the plain ``lm_eval`` command and ``launch.eval
--suite=lm_eval:...`` run a trained run end to end."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

pytest.importorskip("lm_eval")  # an optional dependency (hwh-jax[eval])

from conftest import main_job_run

from hwh_jax.data.paths import resolve
from hwh_jax.data.tokenizers import GPT2BPE
from hwh_jax.eval import commonsense, harness
from hwh_jax.models import HybridLM, model_config

TASKS = commonsense.TASKS
LIMIT = 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random-initialised tiny HwH (fp32, GPT-2 BPE), its harness model and the shipped
    tasks' YAML."""
    cfg = model_config("hwh", "tiny", dtype="float32").replace(vocab_size=50304)
    model = HybridLM(cfg, rngs=nnx.Rngs(2))
    tok = GPT2BPE(resolve("gpt2_bpe"))
    lm = harness.HwhLM(model=model, tokenizer=tok, batch_size=8, max_length=512)
    folder = tmp_path_factory.mktemp("tasks")
    harness.offline_tasks(TASKS, limit=LIMIT, folder=folder)
    harness.harness_own_tasks(TASKS, limit=LIMIT, folder=folder)
    return model, cfg, tok, lm, folder


def _requests(tok, task):
    """The in-house suite's requests of ``task``'s first LIMIT examples, in its order."""
    out = []
    for ex in commonsense.load_task(task, limit=LIMIT):
        if task == "winogrande":
            pairs = [(c, ex["continuation"]) for c in ex["contexts"]]
        elif task == "lambada_openai":
            pairs = [(ex["context"], ex["continuation"])]
        else:
            pairs = [(ex["context"], c) for c in ex["choices"]]
        for ctx, cont in pairs:
            c, k = commonsense.split_encode(tok, ctx, cont)
            out.append((c or [tok.eos_id], k))
    return out


def test_the_harness_asks_what_the_in_house_suite_asks(tiny):
    """Every shipped task through lm-eval: each document's requests score exactly what the
    in-house scorer gives its own requests of that example, and the accuracies are equal; the
    harness's own task definitions (``harness_<task>``: its YAML over the same examples) ask
    the same requests and give the same metrics."""
    model, cfg, tok, lm, folder = tiny
    names = [f"{p}_{t}" for p in ("hwh", "harness") for t in TASKS]
    res = harness.evaluate(lm, names, include_path=str(folder), limit=LIMIT, log_samples=True)
    got = harness.accuracies(res)
    for task in TASKS:
        ours, own = (
            sorted(res["samples"][f"{p}_{task}"], key=lambda s: s["doc_id"])
            for p in ("hwh", "harness")
        )
        assert [s["arguments"] for s in ours] == [s["arguments"] for s in own], task
        assert got[f"harness_{task}"] == got[f"hwh_{task}"], task
        samples = sorted(res["samples"][f"hwh_{task}"], key=lambda s: s["doc_id"])
        theirs = [tuple(r[0]) for s in samples for r in s["resps"]]
        ours = lm.scorer.loglikelihood(_requests(tok, task))
        assert [(round(a, 4), g) for a, g in theirs] == [(round(a, 4), g) for a, g in ours], task
        inhouse = commonsense.evaluate_task(lm.scorer, tok, task, limit=LIMIT, log=lambda *_: None)
        assert got[f"hwh_{task}"]["acc"] == pytest.approx(inhouse["acc"]), task
        if "acc_norm" in inhouse:
            assert got[f"hwh_{task}"]["acc_norm"] == pytest.approx(inhouse["acc_norm"]), task


@pytest.fixture(scope="module")
def main_run():
    """A 4-step run of the main job's config (SentencePiece vocabulary, seq_len 64)."""
    return main_job_run()


GEN_TASK = """task: gen_lambada
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{continuation}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def test_the_export_scores_as_the_run_under_lm_evals_hf_model(main_run, tmp_path):
    """The main job's run (SentencePiece) through ``--model hwh`` and exported through lm-eval's
    own ``hf`` model, with the arguments docs/export.md gives: multiple choice (PIQA's items
    with the longest answers, over 256 tokens, and short ones), rolling log-likelihood
    (WikiText-2 articles of thousands of tokens with literal ``<unk>``) and greedy generation
    give the same metrics and every log-likelihood within 1e-3 (a whole article's, a sum over
    thousands of tokens in fp32 on both sides, within 1e-6 of itself)."""
    import torch
    from lm_eval.models.huggingface import HFLM

    from hwh_jax.training.restore import load_run

    out = tmp_path / "hf"
    done = subprocess.run(
        [sys.executable, "-m", "launch.export_hf", f"--checkpoint={main_run}", f"--out={out}"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert (config["max_position_embeddings"], config["trained_length"]) == (2048, 64)
    assert all((f.stat().st_mode & 0o777) == 0o644 for f in out.iterdir())
    run = load_run(main_run)
    tok = run.tokenizer
    folder = tmp_path / "tasks"
    harness.task_folder(["hwh_piqa", "harness_wikitext2"], folder=folder)
    # PIQA: the 3 items with the longest answer and 3 short ones
    rows = [json.loads(line) for line in (folder / "piqa.jsonl").read_text().splitlines()]
    longest = max(len(tok.encode(c)) for r in rows for c in r["choices"])
    assert longest > 256  # an answer longer than the training length by far
    rows.sort(key=lambda r: -max(len(c) for c in r["choices"]))
    (folder / "piqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3] + rows[-3:]))
    gen_rows = [
        {"context": ex["context"], "continuation": ex["continuation"]}
        for ex in commonsense.load_task("lambada_openai", limit=4)
    ]
    (folder / "gen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gen_rows))
    (folder / "gen_lambada.yaml").write_text(
        GEN_TASK.format(data=json.dumps(str(folder / "gen.jsonl")))
    )
    tasks = ["hwh_piqa", "harness_wikitext2", "gen_lambada"]
    ours = harness.HwhLM(model=run.model, tokenizer=tok, batch_size=4)
    hf = HFLM(
        pretrained=str(out), trust_remote_code=True, dtype=torch.float32, batch_size=4, device="cpu"
    )
    assert hf.max_length == ours.max_length == 2048 and hf.prefix_token_id == tok.eos_id
    kw = dict(include_path=str(folder), limit=3, log_samples=True)
    a, b = harness.evaluate(ours, tasks, **kw), harness.evaluate(hf, tasks, **kw)
    for task in tasks:
        sa, sb = (sorted(r["samples"][task], key=lambda s: s["doc_id"]) for r in (a, b))
        ra, rb = ([r for s in ss for r in s["resps"]] for ss in (sa, sb))
        if task == "gen_lambada":
            assert ra == rb, task
        else:  # [[log-likelihood, greedy]] (multiple choice) or [log-likelihood] (rolling)
            ll = lambda r: r[0][0] if isinstance(r[0], (list, tuple)) else r[0]
            lls_a, lls_b = (np.array([ll(r) for r in rs], float) for rs in (ra, rb))
            # within 1e-3, or 1e-6 of a document's sum over thousands of tokens (fp32 sums)
            np.testing.assert_allclose(lls_b, lls_a, atol=1e-3, rtol=1e-6)
        ma, mb = a["results"][task], b["results"][task]
        for k, v in ma.items():
            if isinstance(v, float) and "stderr" not in k:
                assert mb[k] == pytest.approx(v, rel=1e-6, abs=1e-6), (task, k)


def test_the_plain_lm_eval_command_and_the_eval_suite_on_a_trained_run(main_run, tmp_path):
    """A 4-step run of the main job's config; lm-eval's command line through
    ``python -m launch.lm_eval`` (which registers "hwh") on tasks written by ``launch.lm_eval_tasks``
    writes lm-eval's results file, in a folder named after the run, reporting the batch that
    ran; ``launch.eval --suite=lm_eval:...`` writes each task's n,
    accuracy and interval, the accuracy equal to lm-eval's."""
    work, tasks = main_run, tmp_path / "tasks"
    write = [sys.executable, "-m", "launch.lm_eval_tasks", f"--out={tasks}",
             "--tasks=hwh_piqa,hwh_lambada_openai", "--limit=4"]  # fmt: skip
    lm_eval = [
        sys.executable,
        "-m",
        "launch.lm_eval",
        "--model=hwh",
        f"--model_args=pretrained={work},max_length=256",
        "--batch_size=4",
        "--tasks=hwh_piqa,hwh_lambada_openai",
        f"--include_path={tasks}",
        f"--output_path={tmp_path / 'lm_eval'}",
    ]
    suite = [
        sys.executable,
        "-m",
        "launch.eval",
        f"--checkpoint={work}",
        "--suite=lm_eval:hwh_piqa,hwh_lambada_openai",
        "--lm_eval_limit=4",
        f"--out={tmp_path / 'suite'}",
    ]
    for argv in (write, lm_eval, suite):
        done = subprocess.run(argv, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (tmp_path / "lm_eval").rglob("results_*.json")
    assert path.parent.name.endswith(work.name)  # lm-eval's folder named after pretrained=RUN
    header = json.loads(path.read_text())
    assert header["config"]["batch_size"] in (4, "4")  # what ran: lm-eval's --batch_size
    theirs = header["results"]
    (path,) = (tmp_path / "suite").rglob("results.json")
    ours = json.loads(path.read_text())["lm_eval"]
    for task in ("hwh_piqa", "hwh_lambada_openai"):
        assert ours[task]["n"] == 4
        assert ours[task]["acc"] == pytest.approx(theirs[task]["acc,none"])
        lo, hi = ours[task]["acc_interval"]
        assert lo <= ours[task]["acc"] <= hi


def test_model_args_name_the_run_and_the_batch_is_lm_evals():
    """``pretrained=`` or ``checkpoint=`` name the run; the batch is lm-eval's --batch_size
    (32 for "auto" or none), and one in the model args is refused, naming the flag."""
    parse = harness.HwhLM.parse_args
    assert parse("pretrained=r,step=3", {"batch_size": 4}) == {
        "checkpoint": "r",
        "step": "3",
        "batch_size": "4",
    }
    assert parse({"checkpoint": "r"}, {"batch_size": "auto"})["batch_size"] == "32"
    assert parse("checkpoint=r", None)["batch_size"] == "32"
    with pytest.raises(ValueError, match="--batch_size 16"):
        parse("pretrained=r,batch_size=16", {"batch_size": 1})
    with pytest.raises(ValueError, match="two runs"):
        parse("pretrained=a,checkpoint=b")


def test_launch_lm_eval_registers_its_model_through_the_public_registry(monkeypatch):
    """``launch.lm_eval.register`` puts ``RunLM`` under "hwh" in lm-eval's registry, a second
    call agrees, and lm-eval's own models stay found; nothing of the project is installed
    into the environment's start-up (no .pth file ships)."""
    from lm_eval.api.registry import get_model, model_registry

    import launch.lm_eval
    from launch.lm_eval_model import RunLM

    monkeypatch.setattr(launch.lm_eval, "_started", True)  # not the launchers' process set-up
    assert launch.lm_eval.register() is RunLM and get_model("hwh") is RunLM
    assert launch.lm_eval.register() is RunLM  # a second registration agrees
    assert get_model("hf").__name__ == "HFLM" and "hwh" in model_registry
    root = Path(__file__).resolve().parents[2]
    assert not list(root.glob("*.pth")) and not (root / "setup.py").exists()


def test_only_the_first_process_writes_results():
    """``launch.lm_eval`` on several processes: the first keeps every argument, the others lose
    the ones that write or upload results (with their values, in either spelling) and keep
    the rest, so that every process runs the same requests."""
    from launch.lm_eval import check_args, first_process_argv

    argv = ["--model", "hwh", "--output_path", "out", "--log_samples", "--tasks=hwh_piqa",
            "-o=x", "--wandb_args", "project=p", "--limit", "8"]  # fmt: skip
    assert first_process_argv(argv, 0) == argv
    rest = first_process_argv(argv, 3)
    assert rest == ["--model", "hwh", "--tasks=hwh_piqa", "--limit", "8"]
    check_args(rest)  # still lm-eval's command line


def test_rolling_loglikelihood_and_generation(tiny):
    """``loglikelihood_rolling`` of a text within one window is the log-likelihood of all its
    tokens after EOS; over windows of 16 tokens it is the sum of each window's, every token
    counted once; ``generate_until`` is the Generator's greedy continuation cut at the first
    stop string."""
    from lm_eval.api.instance import Instance
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    from hwh_jax.inference import Generator

    model, cfg, tok, lm, _ = tiny
    text = "It was the best of times, it was the worst of times, it was the age of wisdom"
    ids = tok.encode(text)
    req = lambda kind, args: Instance(request_type=kind, doc={}, arguments=args, idx=0)
    (whole,) = lm.loglikelihood_rolling([req("loglikelihood_rolling", (text,))])
    ((expected, _),) = lm.scorer.loglikelihood([([tok.eos_id], ids)])
    assert whole == pytest.approx(expected, rel=1e-5)
    short = harness.HwhLM(model=model, tokenizer=tok, batch_size=8, max_length=16)
    (windowed,) = short.loglikelihood_rolling([req("loglikelihood_rolling", (text,))])
    windows = [
        make_disjoint_window(w)
        for w in get_rolling_token_windows(ids, tok.eos_id, max_seq_len=16, context_len=1)
    ]
    assert sum(len(c) for _, c in windows) == len(ids) > 16
    by_hand = sum(lm.scorer.loglikelihood([w])[0][0] for w in windows)
    assert windowed == pytest.approx(by_hand, rel=1e-5) and windowed != pytest.approx(whole)
    gen = Generator(model, eos_id=tok.eos_id, vocab=tok.vocab_size, pad_id=tok.pad_id)
    full = tok.decode(gen.generate([ids], 12)[0][0])
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    (out,) = lm.generate_until(
        [req("generate_until", (text, {"until": [stop], "max_gen_toks": 12}))]
    )
    assert out == full[: full.index(stop)]
    # several prompts of different lengths and two max_gen_toks, batched (three rows a batch,
    # left-padded): each row generates what it generates alone, in the requests' order
    texts = [text[:n] for n in (9, 40, 25, 60, 14)]
    lengths = [12, 5, 12, 12, 5]
    asked = [
        req("generate_until", (t, {"until": ["\n\n\n"], "max_gen_toks": n}))
        for t, n in zip(texts, lengths, strict=True)
    ]
    batched = harness.HwhLM(model=model, tokenizer=tok, batch_size=3).generate_until(asked)
    alone = [tok.decode(gen.generate([tok.encode(t)], n)[0][0]) for t, n in zip(texts, lengths)]
    assert batched == alone and len(set(alone)) > 1  # rows that differ: the order counts
