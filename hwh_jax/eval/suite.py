"""The evaluation suite over one trained model: NIAH, MQAR, perplexity by position, the
retrieval probe, commonsense, lm-evaluation-harness tasks.

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
import shutil
import time
from typing import Callable

import numpy as np

from hwh_jax import storage
from hwh_jax.data.sources import read_text
from hwh_jax.eval import commonsense, longppl, mqar, niah, perplexity, plots, stats
from hwh_jax.eval.retrieval_probe import retrieval_probe
from hwh_jax.eval.scoring import Scorer
from hwh_jax.inference.generate import Generator


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
    # the wording of the synthetic retrieval documents it was trained on ("ruler": NIAH's own;
    # data.retrieval_format): the retrieval probe reads that wording as well as NIAH's
    retrieval_format: str = "ruler"
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
    lm_eval_tasks: tuple = ()  # lm-evaluation-harness tasks of the "lm_eval" suite: the
    #                                     shipped hwh_<task> (no download) or the harness's own
    lm_eval_limit: int = 0  # first N examples per harness task; 0 = all
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
        if ("lm_eval" in self.suites) != bool(self.lm_eval_tasks):
            raise ValueError(
                "the lm_eval suite needs its tasks and tasks need the suite: "
                "--suite=lm_eval:TASK[,TASK...] (e.g. lm_eval:hwh_arc_easy,hwh_piqa)"
            )
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


@dataclasses.dataclass
class Run:
    """What every suite of one ``run_suite`` call shares: the model, the settings, where the
    results go (``results``, saved by ``save`` after each suite), a scorer, and the held-out
    stream, read once on first use."""

    subject: EvalModel
    spec: EvalSpec
    out_dir: object
    log: Callable
    evaluator: EvalModel | None
    results: dict
    scorer: Scorer
    max_len: int
    save: Callable[[bool], None]
    _stream: np.ndarray | None = None

    @property
    def train_len(self) -> int:
        return int(self.subject.train_len)

    @property
    def stream(self) -> np.ndarray:
        if self._stream is None:
            self._stream = _heldout_stream(self.subject, self.spec)
        return self._stream


def _retrieval(run: Run):  # first: one forward pass per batch, in the log at once
    """The probe in NIAH's wording ("retrieval") and, for a model trained on another wording,
    in that one too ("retrieval_trained_format"): did it learn the task it was taught, and does
    that carry to NIAH's templates?"""
    tok, spec, trained = run.subject.tokenizer, run.spec, run.subject.retrieval_format
    kw = dict(num=spec.retrieval_documents, log=run.log)
    run.results["retrieval"] = retrieval_probe(run.scorer, tok, run.stream, run.train_len, **kw)
    if trained != "ruler":
        run.results["retrieval_trained_format"] = retrieval_probe(
            run.scorer, tok, run.stream, run.train_len, fmt=trained, **kw
        )


def _niah(run: Run):
    subject, spec, L, tok = run.subject, run.spec, run.train_len, run.subject.tokenizer
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

    def by_cell(rows, value):
        return {
            f"{t}@{n}": value([r["score"] for r in rows if r["task"] == t and r["length"] == n])
            for t in spec.niah_tasks
            for n in sorted({r["length"] for r in rows})
        }

    def partial(rows):  # after each length, so that a cut run keeps what it measured
        run.results["niah"] = rows
        run.results["niah_summary"] = by_cell(rows, lambda v: float(np.mean(v)))
        run.results["niah_intervals"] = by_cell(rows, stats.share)
        run.save(False)

    rows = niah.run_niah(
        gen,
        tok,
        tasks=spec.niah_tasks,
        lengths=lengths,
        depths=depth_grid(spec.niah_depths),
        samples=spec.niah_samples,
        batch_size=spec.batch_size,
        log=run.log,
        on_length=partial,
        seed=subject.seed,
    )
    for t in spec.niah_tasks:
        plots.niah_heatmap(rows, t, f"{subject.name}: {t}", run.out_dir / f"niah_{t}.png", L)


def _ppl(run: Run):
    spec, L = run.spec, run.train_len
    run.results["ppl"] = perplexity.ppl_by_position(
        run.scorer,
        run.stream,
        max_len=spec.ppl_factor * L,
        bucket=max(L // spec.ppl_buckets_per_train_len, 1),
        max_windows=spec.ppl_windows,
        log=run.log,
    )
    plots.ppl_chart({run.subject.name: run.results["ppl"]}, run.out_dir / "ppl_by_position.png", L)


def _longppl(run: Run):
    subject, spec, L, evaluator = run.subject, run.spec, run.train_len, run.evaluator
    judge = run.scorer
    if evaluator is not None:
        if evaluator.tokenizer.name != subject.tokenizer.name:
            raise ValueError(
                f"LongPPL evaluator {evaluator.name} has tokenizer "
                f"{evaluator.tokenizer.name}, {subject.name} {subject.tokenizer.name}"
            )
        judge = Scorer(evaluator.model, batch_size=spec.batch_size, max_len=run.max_len)
    short = spec.longppl_short or L
    result = longppl.evaluate_longppl(
        run.scorer,
        judge,
        run.stream,
        length=spec.longppl_factor * L,
        short=short,
        stride=max(short // 2, 1),
        alpha=spec.longppl_alpha,
        beta=spec.longppl_beta,
        max_windows=spec.longppl_windows,
        log=run.log,
    )
    result["evaluator"] = subject.name if evaluator is None else evaluator.name
    run.results["longppl"] = result
    plots.longppl_chart(result, run.out_dir / "longppl.png", subject.name, L)


def _mqar(run: Run):
    spec = run.spec
    run.results["mqar"] = mqar.evaluate_mqar(
        run.scorer,
        vocab_size=spec.mqar_vocab or min(run.subject.tokenizer.vocab_size, 8192),
        settings=spec.mqar_settings,
        num_examples=spec.mqar_examples,
        log=run.log,
    )


def _commonsense(run: Run):
    spec = run.spec
    run.results["commonsense"] = {}
    for t in spec.commonsense_tasks:
        run.results["commonsense"][t] = commonsense.evaluate_task(
            run.scorer, run.subject.tokenizer, t, limit=spec.commonsense_limit or None, log=run.log
        )
        run.save(False)


def _lm_eval(run: Run):
    """lm-evaluation-harness on the model (``hwh_jax.eval.harness``): each task's metrics, its
    number of examples, and for accuracies the 95% Wilson interval."""
    from hwh_jax.eval import harness  # lm_eval: an optional dependency (hwh-jax[eval])

    spec, tasks = run.spec, list(run.spec.lm_eval_tasks)
    folder = harness.task_folder(tasks)
    lm = harness.HwhLM(
        model=run.subject.model,
        tokenizer=run.subject.tokenizer,
        batch_size=spec.batch_size,
        max_length=run.max_len,
    )
    try:
        results = harness.evaluate(lm, tasks, include_path=folder, limit=spec.lm_eval_limit or None)
    finally:  # the tasks' JSONL and YAML, written for this evaluation
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    out = {}
    for task, metrics in harness.accuracies(results).items():
        n = int(results["n-samples"][task]["effective"])
        row = {"n": n, **metrics}
        for name in ("acc", "acc_norm"):
            if name in metrics:
                row[f"{name}_interval"] = stats.wilson(metrics[name] * n, n)
        out[task] = row
        run.log(f"lm_eval {task}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    run.results["lm_eval"] = out


# Every suite by name, in the order run_suite runs them: a suite is a function of the Run that
# writes its results under its name; a new one is a function here and a line in this table.
SUITES: dict[str, Callable[[Run], None]] = {
    "retrieval": _retrieval,
    "niah": _niah,
    "ppl": _ppl,
    "longppl": _longppl,
    "mqar": _mqar,
    "commonsense": _commonsense,
    "lm_eval": _lm_eval,
}


def run_suite(
    subject: EvalModel,
    spec: EvalSpec,
    out_dir: storage.PathLike,
    log=print,
    evaluator: EvalModel | None = None,
) -> dict:
    """Every suite of ``spec`` on ``subject``, in the order of ``SUITES``; ``results.json`` is
    rewritten after each. ``evaluator``: the model choosing LongPPL's key tokens (default
    ``subject`` itself; it must share its tokenizer)."""
    spec.validate()
    out_dir = storage.path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    L = int(subject.train_len)
    results = {
        "model": subject.name,
        "arch": subject.arch,
        "step": subject.step,
        "workdir": str(subject.workdir),
        "train_len": L,
        "spec": dataclasses.asdict(spec),
    }
    max_len = int(L * max(max(spec.niah_factors), spec.ppl_factor, spec.longppl_factor))
    t0 = time.time()

    def save(finished: bool):
        """results.json after every suite (and NIAH length), so that a run cut by a time limit
        keeps what it measured; ``finished`` says whether every suite ran."""
        results["finished"] = finished
        results["wall_s"] = time.time() - t0
        (out_dir / "results.json").write_text(json.dumps(results, indent=2))

    run = Run(
        subject,
        spec,
        out_dir,
        log,
        evaluator,
        results,
        Scorer(subject.model, batch_size=spec.batch_size, max_len=max_len),
        max_len,
        save,
    )
    try:
        for name, suite in SUITES.items():
            if name in spec.suites:
                suite(run)
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
