"""The evaluation suite over one trained model: NIAH, MQAR, perplexity by position, the
retrieval probe, commonsense.

``run_suite(subject, spec, out_dir)`` evaluates an ``EvalModel`` (a model with its tokenizer,
training length and held-out text; ``hwh_jax.training.restore.LoadedRun.eval_model()`` makes
one from a workdir), writes ``results.json`` and its figures under ``out_dir`` and returns the
results; ``compare`` draws the cross-model figures (extrapolation chart, perplexity vs
position). ``EvalSpec`` holds every setting and its default (run configs' ``eval`` section and
``launch.eval``'s flags are built from it).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Callable

import numpy as np

from hwh_jax import storage
from hwh_jax.data.sources import read_text
from hwh_jax.eval import commonsense, longppl, mqar, niah, perplexity, plots, stats
from hwh_jax.eval.retrieval_probe import retrieval_probe
from hwh_jax.eval.scoring import Scorer
from hwh_jax.inference.generate import Generator

SUITES = ("niah", "mqar", "ppl", "longppl", "retrieval", "commonsense")


@dataclasses.dataclass
class EvalModel:
    """What the suite evaluates: a model with its tokenizer, its training length (NIAH and
    perplexity lengths are multiples of it), a name for tables and plots, its held-out token
    stream (an array, or a function that builds it on first use), and its run's seed: NIAH
    draws its prompts' keys and values with it, so each seed of an experiment is asked its own
    prompts (seed 0 the prompts of before)."""

    model: object  # a HybridLM
    tokenizer: object
    train_len: int
    name: str
    arch: str = ""
    step: int = 0
    workdir: str = ""
    seed: int = 0
    # the held-out token stream (an array or a lazily read ``TokenStream``: the suites slice it),
    # or a function making it on first use
    heldout: np.ndarray | Callable[[], np.ndarray] | None = None

    def heldout_stream(self) -> np.ndarray:
        if self.heldout is None:
            raise ValueError(f"{self.name} has no held-out text; set the eval spec's ppl_text")
        if callable(self.heldout):
            self.heldout = self.heldout()
        return self.heldout


@dataclasses.dataclass
class EvalSpec:
    """Which suites run and how; the one place the evaluation's defaults live."""

    suites: tuple = ("niah", "ppl")
    batch_size: int = 8
    niah_tasks: tuple = niah.SINGLE  # niah.TASKS has the multi-key, -value and -query variants
    niah_factors: tuple = (1, 2, 4)  # lengths = factor x the run's training length
    niah_depths: int = 5  # evenly spaced in [0, 100] (RULER: 40)
    niah_samples: int = 20  # prompts per (task, length, depth): cells of
    #                                     depths x samples prompts (100 at 5 depths)
    ppl_factor: int = 4  # windows of factor x training length
    ppl_buckets_per_train_len: int = 4
    ppl_windows: int = 64
    ppl_text: str = ""  # a text file; default the run's held-out split
    mqar_vocab: int = 0  # 0: the model's vocabulary (capped at 8192)
    mqar_settings: tuple = ((64, 4), (128, 8), (256, 16))
    mqar_examples: int = 64
    retrieval_documents: int = 64  # synthetic NIAH-format documents from held-out text
    commonsense_tasks: tuple = commonsense.TASKS
    commonsense_limit: int = 0  # first N examples per task; 0 = all
    longppl_factor: int = 4  # LongPPL windows of factor x training length
    longppl_short: int = 0  # the evaluator's short context; 0 = the training length
    longppl_alpha: float = 2.0  # key tokens: long - short log-prob > alpha ...
    longppl_beta: float = -2.0  # ... and long-context log-prob > beta
    longppl_windows: int = 16

    def validate(self):
        bad = [s for s in self.suites if s not in SUITES]
        if bad:
            raise ValueError(f"unknown eval suite(s) {bad}; known: {list(SUITES)}")
        bad = [t for t in self.niah_tasks if t not in niah.TASKS]
        if bad:
            raise ValueError(f"unknown NIAH task(s) {bad}; known: {list(niah.TASKS)}")
        bad = [t for t in self.commonsense_tasks if t not in commonsense.TASKS]
        if bad:
            raise ValueError(f"unknown commonsense task(s) {bad}; known: {list(commonsense.TASKS)}")
        if self.niah_depths < 1 or any(f <= 0 for f in self.niah_factors):
            raise ValueError(
                f"niah_depths={self.niah_depths} and niah_factors="
                f"{self.niah_factors} must be positive"
            )


def check_for_run(spec: EvalSpec, tokenizer, train_len: int) -> None:
    """What a spec needs of a run known before it trains: every NIAH length holds its
    template and answer with this tokenizer (else one line naming the keys to change)."""
    if "niah" not in spec.suites:
        return
    lengths = [int(f * train_len) for f in spec.niah_factors]
    try:
        niah.check_lengths(spec.niah_tasks, lengths, tokenizer)
    except niah.TooShort as e:
        raise ValueError(
            f"eval: {e}; raise seq_len or eval.niah_factors "
            f"({list(spec.niah_factors)} x {train_len}), or drop the task from "
            f"eval.niah_tasks"
        ) from None


def depth_grid(n: int) -> list[int]:
    return [0] if n == 1 else [round(i * 100 / (n - 1)) for i in range(n)]


def _heldout_stream(subject: EvalModel, spec: EvalSpec) -> np.ndarray:
    if spec.ppl_text:
        return np.asarray(
            subject.tokenizer.encode(read_text(storage.path(spec.ppl_text))), np.int32
        )
    return subject.heldout_stream()


def _tupled(value):
    return tuple(_tupled(v) for v in value) if isinstance(value, (list, tuple)) else value


def spec_from_config(e) -> EvalSpec:
    """EvalSpec from a run config's ``eval`` section (its fields, plus ``at_end``)."""
    fields = {f.name for f in dataclasses.fields(EvalSpec)}
    return EvalSpec(**{k: _tupled(v) for k, v in e.items() if k in fields})


def run_suite(
    subject: EvalModel,
    spec: EvalSpec,
    out_dir: storage.PathLike,
    log=print,
    evaluator: EvalModel | None = None,
) -> dict:
    """Every suite of ``spec`` on ``subject``; ``results.json`` is rewritten after each.
    ``evaluator``: the model choosing LongPPL's key tokens (default ``subject`` itself; it must
    share its tokenizer)."""
    spec.validate()
    out_dir = storage.path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    L = int(subject.train_len)
    tok = subject.tokenizer
    results = {
        "model": subject.name,
        "arch": subject.arch,
        "step": subject.step,
        "workdir": str(subject.workdir),
        "train_len": L,
        "spec": dataclasses.asdict(spec),
    }
    max_len = int(L * max(max(spec.niah_factors), spec.ppl_factor, spec.longppl_factor))
    scorer = Scorer(subject.model, batch_size=spec.batch_size, max_len=max_len)
    t0 = time.time()

    def save(finished: bool):
        """results.json after every suite (and NIAH length), so that a run cut by a time limit
        keeps what it measured; ``finished`` says whether every suite ran."""
        results["finished"] = finished
        results["wall_s"] = time.time() - t0
        (out_dir / "results.json").write_text(json.dumps(results, indent=2))

    def niah_summary(rows):
        return {
            f"{t}@{n}": float(
                np.mean([r["score"] for r in rows if r["task"] == t and r["length"] == n])
            )
            for t in spec.niah_tasks
            for n in sorted({r["length"] for r in rows})
        }

    def niah_intervals(rows):
        return {
            f"{t}@{n}": stats.share(
                [r["score"] for r in rows if r["task"] == t and r["length"] == n]
            )
            for t in spec.niah_tasks
            for n in sorted({r["length"] for r in rows})
        }

    def niah_partial(rows):
        results["niah"], results["niah_summary"] = rows, niah_summary(rows)
        results["niah_intervals"] = niah_intervals(rows)
        save(False)

    try:
        if {"ppl", "longppl", "retrieval"} & set(spec.suites):
            stream = _heldout_stream(subject, spec)
        if "retrieval" in spec.suites:  # first: one forward pass per batch, in the log at once
            results["retrieval"] = retrieval_probe(
                scorer, tok, stream, L, num=spec.retrieval_documents, log=log
            )
            save(False)
        if "niah" in spec.suites:
            lengths = [int(f * L) for f in spec.niah_factors]
            # prompts padded to multiples of L, prefilled in chunks of L, one cache size for all
            # lengths: one compiled init, prefill and decode for the whole sweep
            gen = Generator(
                subject.model,
                eos_id=tok.eos_id,
                vocab=tok.vocab_size,
                pad_id=tok.pad_id,
                prefill_chunk=L,
                length_multiple=L,
                cache_len=-(-max(lengths) // L) * L + niah.answer_budget(spec.niah_tasks),
            )
            rows = niah.run_niah(
                gen,
                tok,
                tasks=spec.niah_tasks,
                lengths=lengths,
                depths=depth_grid(spec.niah_depths),
                samples=spec.niah_samples,
                batch_size=spec.batch_size,
                log=log,
                on_length=niah_partial,
                seed=subject.seed,
            )
            for t in spec.niah_tasks:
                plots.niah_heatmap(rows, t, f"{subject.name}: {t}", out_dir / f"niah_{t}.png", L)
        if "ppl" in spec.suites:
            bucket = max(L // spec.ppl_buckets_per_train_len, 1)
            results["ppl"] = perplexity.ppl_by_position(
                scorer,
                stream,
                max_len=spec.ppl_factor * L,
                bucket=bucket,
                max_windows=spec.ppl_windows,
                log=log,
            )
            plots.ppl_chart({subject.name: results["ppl"]}, out_dir / "ppl_by_position.png", L)
            save(False)
        if "longppl" in spec.suites:
            judge = scorer
            if evaluator is not None:
                if evaluator.tokenizer.name != tok.name:
                    raise ValueError(
                        f"LongPPL evaluator {evaluator.name} has tokenizer "
                        f"{evaluator.tokenizer.name}, {subject.name} {tok.name}"
                    )
                judge = Scorer(evaluator.model, batch_size=spec.batch_size, max_len=max_len)
            short = spec.longppl_short or L
            results["longppl"] = longppl.evaluate_longppl(
                scorer,
                judge,
                stream,
                length=spec.longppl_factor * L,
                short=short,
                stride=max(short // 2, 1),
                alpha=spec.longppl_alpha,
                beta=spec.longppl_beta,
                max_windows=spec.longppl_windows,
                log=log,
            )
            results["longppl"]["evaluator"] = subject.name if evaluator is None else evaluator.name
            plots.longppl_chart(results["longppl"], out_dir / "longppl.png", subject.name, L)
            save(False)
        if "mqar" in spec.suites:
            vocab = spec.mqar_vocab or min(tok.vocab_size, 8192)
            results["mqar"] = mqar.evaluate_mqar(
                scorer,
                vocab_size=vocab,
                settings=spec.mqar_settings,
                num_examples=spec.mqar_examples,
                log=log,
            )
            save(False)
        if "commonsense" in spec.suites:
            results["commonsense"] = {}
            for t in spec.commonsense_tasks:
                results["commonsense"][t] = commonsense.evaluate_task(
                    scorer, tok, t, limit=spec.commonsense_limit or None, log=log
                )
                save(False)
    except BaseException as e:
        # a signal, a time limit, an error: what was measured stays, marked unfinished
        results["stopped"] = f"{type(e).__name__}: {e}"[:300]
        save(False)
        raise
    save(True)
    return results


def compare(all_results: list[dict], out_dir: storage.PathLike):
    """Cross-model figures from several ``run_suite`` results."""
    out_dir = storage.path(out_dir)
    train_len = all_results[0]["train_len"]
    niah_rows = {r["model"]: r["niah"] for r in all_results if "niah" in r}
    if niah_rows:
        plots.extrapolation_chart(niah_rows, out_dir / "niah_extrapolation.png", train_len)
    ppl_rows = {r["model"]: r["ppl"] for r in all_results if "ppl" in r}
    if ppl_rows:
        plots.ppl_chart(ppl_rows, out_dir / "ppl_by_position.png", train_len)
