"""Zero-shot commonsense tasks, scored by log-likelihood as lm-evaluation-harness does.

Each example is a context and candidate continuations; the prediction is the candidate with the
highest summed log-probability (``acc``) or the highest log-probability per character of the
continuation (``acc_norm``). Prompts follow the harness's task definitions:

    arc_easy, arc_challenge   "Question: {q}\\nAnswer:"  + " {choice}"
    piqa                      "Question: {goal}\\nAnswer:" + " {solution}"
    openbook_qa               "{question_stem}" + " {choice}"
    hellaswag                 "{activity}: {context}" + " {ending}"  (harness preprocessing:
                              "[title]" -> ". ", other [tags] dropped, double spaces removed)
    winogrande                each option's sentence prefix + " {rest of sentence}" (partial
                              scoring: only the shared continuation is scored)
    lambada_openai            "{context}" + " {last word}": acc = every token of the word greedy

Files are the shipped ``evals/`` (``hwh_jax/assets``: MosaicML eval-gauntlet JSONL, gzipped;
HellaSwag's 6-line text form). The HellaSwag context is the file's (its second sentence is not
re-capitalised as the harness does from the raw ctx_a / ctx_b fields, which this file no longer
separates).
"""

from __future__ import annotations

import bz2
import gzip
import json
import re

import numpy as np

from hwh_jax import storage
from hwh_jax.data.paths import resolve
from hwh_jax.progress import Progress

TASKS = (
    "arc_easy",
    "arc_challenge",
    "piqa",
    "openbook_qa",
    "hellaswag",
    "winogrande",
    "lambada_openai",
)


def _jsonl(root: storage.PathLike, task: str):
    """Rows of ``<task>.jsonl`` in ``root``, or of ``<task>.jsonl.gz`` (the shipped form)."""
    path = root / f"{task}.jsonl"
    if not path.exists() and path.with_suffix(".jsonl.gz").exists():
        path = path.with_suffix(".jsonl.gz")
    if not path.exists():
        raise FileNotFoundError(
            f"commonsense task {task!r}: neither {path.name} nor {path.name}.gz in {root}"
        )
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _hellaswag_preprocess(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def load_task(task: str, folder: storage.PathLike | None = None, limit: int | None = None):
    """Examples {context(s), choices, gold} of ``task`` (first ``limit`` of them)."""
    root = storage.path(folder) if folder else resolve("evals")
    if task in ("arc_easy", "arc_challenge", "piqa", "openbook_qa"):
        rows = _jsonl(root, task)
        out = []
        for r in rows:
            q = r["query"]
            if task != "openbook_qa":
                q = q.rstrip() + "\nAnswer:"
            out.append(
                {"context": q, "choices": [" " + c for c in r["choices"]], "gold": int(r["gold"])}
            )
    elif task == "hellaswag":
        with bz2.open(
            root / "hellaswag" / "hellaswag_val_full.txt.bz2", "rt", encoding="utf-8"
        ) as f:
            lines = f.read().split("\n")
        if lines and lines[-1] == "":
            lines = lines[:-1]
        if len(lines) % 6:
            raise ValueError(f"hellaswag: {len(lines)} lines is not 6 per task")
        out = [
            {
                "context": _hellaswag_preprocess(lines[i]),
                "choices": [" " + _hellaswag_preprocess(e) for e in lines[i + 2 : i + 6]],
                "gold": int(lines[i + 1]),
            }
            for i in range(0, len(lines), 6)
        ]
    elif task == "winogrande":
        out = [
            {
                "contexts": r["context_options"],
                "continuation": " " + r["continuation"],
                "gold": int(r["gold"]),
            }
            for r in _jsonl(root, "winogrande")
        ]
    elif task == "lambada_openai":
        out = [
            {"context": r["context"], "continuation": " " + r["continuation"].strip()}
            for r in _jsonl(root, "lambada_openai")
        ]
    else:
        raise ValueError(f"unknown commonsense task {task!r}; known: {list(TASKS)}")
    for i, ex in enumerate(out):
        if "choices" in ex and not 0 <= ex["gold"] < len(ex["choices"]):
            raise ValueError(
                f"{task} example {i}: gold {ex['gold']} outside its {len(ex['choices'])} choices"
            )
    return out[:limit] if limit else out


def chance(task: str, limit: int | None = None) -> float | None:
    """The accuracy of a uniform guess over the first ``limit`` examples of ``task`` (the mean
    of 1 / its number of choices); None for lambada_openai (a free continuation)."""
    if task == "lambada_openai":
        return None
    examples = load_task(task, limit=limit)
    return sum(1 / len(ex.get("choices") or ex["contexts"]) for ex in examples) / len(examples)


def split_encode(tokenizer, context: str, continuation: str):
    """(context ids, continuation ids) by encoding the whole and splitting, as the harness
    does, so that tokens spanning the boundary are counted as the continuation's."""
    whole = tokenizer.encode(context + continuation)
    ctx = tokenizer.encode(context)
    n = len(ctx)
    while n > 0 and whole[:n] != ctx[:n]:  # merges across the boundary: shorten the context
        n -= 1
    return whole[:n], whole[n:]


def evaluate_task(scorer, tokenizer, task: str, *, limit: int | None = None, log=print) -> dict:
    examples = load_task(task, limit=limit)
    requests, owners = [], []
    for i, ex in enumerate(examples):
        if task == "winogrande":
            for c in ex["contexts"]:
                requests.append(split_encode(tokenizer, c, ex["continuation"]))
                owners.append(i)
        elif task == "lambada_openai":
            requests.append(split_encode(tokenizer, ex["context"], ex["continuation"]))
            owners.append(i)
        else:
            for c in ex["choices"]:
                requests.append(split_encode(tokenizer, ex["context"], c))
                owners.append(i)
    requests = [(ctx or [tokenizer.eos_id], cont) for ctx, cont in requests]
    with Progress(len(requests), task, unit="request") as p:
        scores = scorer.loglikelihood(requests, progress=lambda done, _: p.to(done))
    if task == "lambada_openai":
        lp = np.array([s for s, _ in scores])
        n_tok = np.array([len(c) for _, c in requests])
        result = {
            "acc": float(np.mean([g for _, g in scores])),
            "ppl": float(np.exp(-lp.sum() / n_tok.sum())),
        }
    else:
        per = {}
        for (lp, _), i, (_, cont) in zip(scores, owners, requests):
            per.setdefault(i, []).append(lp)
        acc, acc_norm = [], []
        for i, ex in enumerate(examples):
            lps = np.array(per[i])
            acc.append(int(np.argmax(lps)) == ex["gold"])
            if task != "winogrande":
                # the harness's acc_norm: per character of the choice, without the space
                # that joins it to the context
                lengths = np.array([len(c.removeprefix(" ")) for c in ex["choices"]], float)
                acc_norm.append(int(np.argmax(lps / lengths)) == ex["gold"])
        result = {"acc": float(np.mean(acc))}
        if acc_norm:
            result["acc_norm"] = float(np.mean(acc_norm))
    result["examples"] = len(examples)
    log(
        f"{task}: "
        + ", ".join(
            f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()
        )
    )
    return result
