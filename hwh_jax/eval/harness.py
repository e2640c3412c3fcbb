"""The project's models as an lm-evaluation-harness model (``lm_eval``'s ``LM`` interface;
``launch.lm_eval`` registers it as ``hwh``), and the shipped evaluation sets as harness tasks
that need no download.

The model runs the JAX model on this process's devices:

    loglikelihood          (context, continuation) -> (summed log p, every token greedy): the
                           pair encoded whole and split where the context ends
                           (``commonsense.split_encode``), an empty context replaced by EOS,
                           batched by length (``Scorer``)
    loglikelihood_rolling  a text's log p in windows of ``max_length`` tokens (the harness's
                           ``get_rolling_token_windows`` with EOS as the first context)
    generate_until         greedy continuations (``Generator``), cut at the first stop string
                           and after ``max_gen_toks`` tokens; prompts of one ``max_gen_toks``
                           batched (``batch_size`` rows, left-padded, longest first)

Tasks (``offline_tasks``): ``hwh_<task>`` for each task of ``commonsense.TASKS``, written as
harness YAML over JSONL made from the shipped files by the in-house loader (the same
contexts, choices and answers), so the harness's scoring and the in-house scorer's can be set
side by side on the same items. The harness's own tasks (``arc_easy``, ...) run by name where
their datasets are cached or downloadable.

Several processes (a model sharded over hosts): the jitted scorer is one program over every
process's devices, so every process must score every request in the same order; the model
reports itself to lm-eval as one process (``rank`` 0 of ``world_size`` 1) in each, rather than
letting lm-eval split the requests between processes.
"""

from __future__ import annotations

import json
import re
import tempfile

import numpy as np
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from hwh_jax import storage
from hwh_jax.eval import commonsense
from hwh_jax.eval.scoring import Scorer

# lm-eval's metrics for each shipped task, as the harness's own YAML of that task has them
_METRICS = {
    "lambada_openai": [("perplexity", "perplexity", False), ("acc", "mean", True)],
    "winogrande": [("acc", "mean", True)],
}
_DEFAULT_METRICS = [("acc", "mean", True), ("acc_norm", "mean", True)]


class HwhLM(LM):
    """A model and its tokenizer scored as lm-eval asks (module docstring). ``launch.lm_eval``
    registers a subclass of it as lm-eval's model "hwh" that loads a run by
    ``pretrained=RUN``."""

    def __init__(self, model, tokenizer, batch_size: int | str = 32, max_length: int = 2048):
        super().__init__()
        self.model, self.tokenizer = model, tokenizer
        self.max_length = int(max_length)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 32
        self.scorer = Scorer(model, batch_size=self.batch_size, max_len=self.max_length)
        self._generator = None

    @staticmethod
    def parse_args(arg_string, additional_config: dict | None = None) -> dict:
        """lm-eval's ``--model_args`` (a string or the dict lm-eval parsed it into):
        ``pretrained=RUN`` (or ``checkpoint=RUN``: a ``launch.train`` workdir; lm-eval names
        its results folder after ``pretrained``), ``step=N``, ``max_length=L``, as a dict of
        strings with the run under "checkpoint". The batch is lm-eval's own ``--batch_size``
        (in ``additional_config``; the one its results header reports; "auto": 32 sequences a
        forward pass), so ``batch_size`` in the model args is refused; its ``device`` is
        unused (JAX places the model)."""
        if isinstance(arg_string, dict):  # lm-eval parsed them already
            args = {k: str(v) for k, v in arg_string.items()}
        else:
            args = dict(kv.split("=", 1) for kv in arg_string.split(",") if kv)
        if "batch_size" in args:
            raise ValueError(
                f"--model_args batch_size={args['batch_size']}: give lm-eval's --batch_size "
                f"{args['batch_size']} instead (the batch its results report)"
            )
        if "pretrained" in args:
            if args.get("checkpoint", args["pretrained"]) != args["pretrained"]:
                raise ValueError(
                    f"--model_args names two runs: pretrained={args['pretrained']} and "
                    f"checkpoint={args['checkpoint']}; give one"
                )
            args["checkpoint"] = args.pop("pretrained")
        given = str((additional_config or {}).get("batch_size", "auto"))
        args["batch_size"] = given if given.isdigit() else "32"
        return args

    # ------------------------------------------------------------ lm-eval's three calls
    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False):
        pairs = []
        for context, continuation in (r.args for r in requests):
            ctx, cont = commonsense.split_encode(self.tokenizer, context, continuation)
            pairs.append((ctx or [self.tokenizer.eos_id], cont))
        return self.scorer.loglikelihood(pairs)

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False):
        out = []
        for (text,) in (r.args for r in requests):
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    token_list=self.tokenizer.encode(text),
                    prefix_token=self.tokenizer.eos_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            out.append(sum(lp for lp, _ in self.scorer.loglikelihood(windows)))
        return out

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False):
        from hwh_jax.inference import Generator

        if self._generator is None:
            self._generator = Generator(
                self.model,
                eos_id=self.tokenizer.eos_id,
                vocab=self.tokenizer.vocab_size,
                pad_id=self.tokenizer.pad_id,
            )
        rows = {}  # max_gen_toks -> [(request index, prompt ids, stop strings)]
        for i, (context, gen_kwargs) in enumerate(r.args for r in requests):
            kw = dict(gen_kwargs)
            until = kw.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            n = int(kw.pop("max_gen_toks", 256))
            if kw.get("do_sample") or float(kw.get("temperature", 0.0) or 0.0) > 0:
                raise ValueError(f"generate_until: greedy decoding only, got {gen_kwargs}")
            if n >= self.max_length:
                raise ValueError(
                    f"generate_until: max_gen_toks={n} leaves no room for a context in "
                    f"max_length={self.max_length} (--model_args max_length=...)"
                )
            ids = self.tokenizer.encode(context)[-(self.max_length - n) :] or [
                self.tokenizer.eos_id
            ]
            rows.setdefault(n, []).append((i, ids, until))
        out = [""] * len(requests)
        for n, group in rows.items():
            # the longest prompts first and together: the least padding, and an early
            # out-of-memory if any
            group.sort(key=lambda row: -len(row[1]))
            for s in range(0, len(group), self.batch_size):
                part = group[s : s + self.batch_size]
                made = self._generator.generate([ids for _, ids, _ in part], n)[0]
                for (i, _, until), tokens in zip(part, made, strict=True):
                    text = self.tokenizer.decode(tokens)
                    cut = min([text.find(u) for u in until if u and u in text], default=len(text))
                    out[i] = text[:cut]
        return out


# ---------------------------------------------------------------- the shipped tasks
def _task_yaml(task: str, data: str) -> str:
    """lm-eval YAML of ``hwh_<task>`` over the JSONL ``data`` (rows of the in-house loader)."""
    lines = [
        f"task: hwh_{task}",
        "dataset_path: json",
        "dataset_kwargs:",
        "  data_files:",
        f"    test: {json.dumps(data)}",
        "test_split: test",
    ]  # the harness's target delimiter " " joins context and continuation
    if task == "lambada_openai":
        lines += [
            "output_type: loglikelihood",
            'doc_to_text: "{{context}}"',
            'doc_to_target: "{{continuation}}"',
        ]
    elif task == "winogrande":  # partial scoring: one continuation after each option's context
        lines += [
            "output_type: multiple_choice",
            "doc_to_text: gold",
            "doc_to_target: continuation",
            "doc_to_choice: contexts",
        ]
    else:
        lines += [
            "output_type: multiple_choice",
            'doc_to_text: "{{context}}"',
            "doc_to_target: gold",
            "doc_to_choice: choices",
        ]
    lines.append("metric_list:")
    for metric, agg, higher in _METRICS.get(task, _DEFAULT_METRICS):
        lines += [
            f"  - metric: {metric}",
            f"    aggregation: {agg}",
            f"    higher_is_better: {str(higher).lower()}",
        ]
    return "\n".join(lines) + "\n"


def _unspaced(example: dict) -> dict:
    """An in-house multiple-choice example with its continuations' leading space taken off: the
    harness puts it back as the target delimiter, and its acc_norm counts the characters
    without it. (A loglikelihood task's target keeps its space: the harness adds none.)"""
    out = dict(example)
    if "choices" in out:
        out["choices"] = [c.removeprefix(" ") for c in out["choices"]]
    if "contexts" in out:  # WinoGrande: the shared continuation is the target
        out["continuation"] = out["continuation"].removeprefix(" ")
    return out


def offline_tasks(tasks=commonsense.TASKS, *, limit: int | None = None, folder=None) -> str:
    """Write ``hwh_<task>`` YAMLs and their JSONL for ``tasks`` into ``folder`` (default: a new
    temporary folder) and return it, for lm-eval's ``include_path``. ``limit``: the first N
    examples of each (the in-house suite's ``commonsense_limit``)."""
    unknown = [t for t in tasks if t not in commonsense.TASKS]
    if unknown:
        raise ValueError(f"no shipped harness task {unknown}; shipped: {list(commonsense.TASKS)}")
    root = storage.path(folder or tempfile.mkdtemp(prefix="hwh_lm_eval_"))
    root.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        data = root / f"{task}.jsonl"
        rows = [_unspaced(r) for r in commonsense.load_task(task, limit=limit)]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / f"hwh_{task}.yaml").write_text(_task_yaml(task, str(data)))
    return str(root)


# the harness's own YAML of each shipped task (under lm_eval/tasks) and the row of its dataset
# schema made from one in-house example
def _arc(ex):
    q = ex["context"].removeprefix("Question: ").removesuffix("\nAnswer:")
    labels = [chr(ord("A") + i) for i in range(len(ex["choices"]))]
    text = [c[1:] for c in ex["choices"]]  # the in-house choices carry their leading space
    return {
        "question": q,
        "choices": {"text": text, "label": labels},
        "answerKey": labels[ex["gold"]],
    }


def _obqa(ex):
    row = _arc(ex)
    return {
        "question_stem": ex["context"],
        "choices": row["choices"],
        "answerKey": row["answerKey"],
    }


def _piqa(ex):
    goal = ex["context"].removeprefix("Question: ").removesuffix("\nAnswer:")
    return {
        "goal": goal,
        "sol1": ex["choices"][0][1:],
        "sol2": ex["choices"][1][1:],
        "label": ex["gold"],
    }


def _hellaswag(ex):
    label, _, ctx = ex["context"].partition(": ")
    return {
        "activity_label": label,
        "ctx_a": ctx,
        "ctx_b": "",
        "endings": [c[1:] for c in ex["choices"]],
        "label": str(ex["gold"]),
    }


def _winogrande(ex):
    a, b = ex["contexts"]
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    n = a.rfind(" ", 0, n) + 1  # the blank starts a word: the options differ from there on
    return {
        "sentence": a[:n] + "_ " + ex["continuation"].strip(),
        "option1": a[n:],
        "option2": b[n:],
        "answer": str(ex["gold"] + 1),
    }


def _lambada(ex):
    return {"text": ex["context"] + ex["continuation"]}


def wikitext2_articles() -> list[dict]:
    """The shipped WikiText-2 test split (``assets/wikitext2``, its tokenised form with
    ``<unk>``) as documents of lm-eval's ``wikitext`` task: one ``{"page": text}`` per article,
    cut before each top-level heading " = Title = "."""
    from hwh_jax.data.paths import resolve
    from hwh_jax.data.sources import read_text

    text = read_text(resolve("wikitext2/test.txt.gz"))
    pages = re.split(r"(?m)^(?= = [^=\n].* = $)", text)
    return [{"page": p} for p in pages if p.strip()]


HARNESS_OWN = {
    "arc_easy": ("arc/arc_easy.yaml", _arc),
    "arc_challenge": ("arc/arc_challenge.yaml", _arc),
    "piqa": ("piqa/piqa.yaml", _piqa),
    "openbook_qa": ("openbookqa/openbookqa.yaml", _obqa),
    "hellaswag": ("hellaswag/hellaswag.yaml", _hellaswag),
    "winogrande": ("winogrande/default.yaml", _winogrande),
    "lambada_openai": ("lambada/lambada_openai.yaml", _lambada),
}
# rolling log-likelihood (perplexity) over whole documents: lm-eval's own task definition
HARNESS_ROLLING = {"wikitext2": ("wikitext/wikitext.yaml", wikitext2_articles)}


def harness_own_tasks(tasks=commonsense.TASKS, *, limit: int | None = None, folder=None) -> str:
    """Write ``harness_<task>`` for ``tasks``: the harness's own task definition (its YAML
    included: prompts, choices, metrics, preprocessing) over the shipped examples rewritten in
    its dataset's schema; returns the folder, for ``include_path``. Set beside ``hwh_<task>``
    and the in-house suite, it measures what the harness's own definitions change."""
    import lm_eval.tasks as own

    unknown = [t for t in tasks if t not in HARNESS_OWN and t not in HARNESS_ROLLING]
    if unknown:
        raise ValueError(
            f"no shipped harness task {unknown}; shipped: {[*HARNESS_OWN, *HARNESS_ROLLING]}"
        )
    root = storage.path(folder or tempfile.mkdtemp(prefix="hwh_lm_eval_own_"))
    root.mkdir(parents=True, exist_ok=True)
    base = storage.path(own.__file__).parent
    for task in tasks:
        data = root / f"{task}_own.jsonl"
        if task in HARNESS_ROLLING:
            yaml_path, documents = HARNESS_ROLLING[task]
            rows = documents()[:limit]
        else:
            yaml_path, to_row = HARNESS_OWN[task]
            rows = [to_row(ex) for ex in commonsense.load_task(task, limit=limit)]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        split = "validation" if task in ("piqa", "hellaswag", "winogrande") else "test"
        lines = [
            f"include: {json.dumps(str(base / yaml_path))}",
            f"task: harness_{task}",
            "tag: []",
            "dataset_path: json",
            "dataset_name: null",
            "dataset_kwargs:",
            "  data_files:",
            f"    {split}: {json.dumps(str(data))}",
            "training_split: null",
            f"validation_split: {'validation' if split == 'validation' else 'null'}",
            f"test_split: {'test' if split == 'test' else 'null'}",
        ]
        (root / f"harness_{task}.yaml").write_text("\n".join(lines) + "\n")
    return str(root)


def task_folder(names, *, folder=None, limit: int | None = None) -> str | None:
    """The folder (default: a new temporary one) of the shipped tasks among ``names``
    (``hwh_<task>`` and ``harness_<task>``), written for ``include_path``; None if there are
    none."""
    ours = [n.removeprefix("hwh_") for n in names if n.startswith("hwh_")]
    own = [n.removeprefix("harness_") for n in names if n.startswith("harness_")]
    if not ours and not own:
        return None
    folder = str(folder or tempfile.mkdtemp(prefix="hwh_lm_eval_"))
    if ours:
        offline_tasks(ours, folder=folder, limit=limit)
    if own:
        harness_own_tasks(own, folder=folder, limit=limit)
    return folder


def evaluate(lm: LM, tasks, *, include_path: str | None = None, limit=None, log_samples=False):
    """lm-eval's ``simple_evaluate`` of ``lm`` on ``tasks`` (names; the shipped ``hwh_*``
    found through ``include_path``) -> its results dict."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path) if include_path else None
    return simple_evaluate(
        model=lm,
        tasks=list(tasks),
        task_manager=manager,
        limit=limit,
        log_samples=log_samples,
        bootstrap_iters=0,
    )


def accuracies(results: dict) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} of an lm-eval results dict (its "metric,filter" keys split)."""
    out = {}
    for task, row in results["results"].items():
        out[task] = {
            k.split(",")[0]: float(v)
            for k, v in row.items()
            if "," in k and "stderr" not in k and isinstance(v, int | float | np.floating)
        }
    return out
