"""RULER's needle-in-a-haystack tasks (Hsieh et al., 2024): niah_single_1/2/3, the default
set, and the multi-key, multi-value and multi-query variants.

Templates are RULER's (``scripts/data/synthetic/constants.py`` and ``niah.py``; kept in
``hwh_jax.data.ruler``, which the synthetic retrieval training documents share), rendered as
RULER renders them for one key and one value (the singular):

    A special magic {number} is hidden within the following text. Make sure to memorize it.
    I will quiz you about the {number} afterwards.\n{context}\nWhat is the special magic
    {number} for {key} mentioned in the provided text? The special magic {number} for {key}
    mentioned in the provided text is

with the needle "One of the special magic {numbers} for {key} is: {value}." inserted into the
haystack at the requested depth. Tasks:

    niah_single_1  noise haystack ("The grass is green. ... There and back again." repeated),
                   key: word, value: 7-digit number
    niah_single_2  Paul Graham essays (sorted by file name, whitespace collapsed), key: word,
                   value: 7-digit number
    niah_single_3  essays, key: word, value: UUID
    niah_multikey_1   essays, 4 keys planted, one asked (word keys, number values)
    niah_multikey_2   a haystack of distractor needles only (RULER's "needle" haystack),
                      word keys, number values
    niah_multikey_3   distractor needles, UUID keys, UUID values
    niah_multivalue   essays, one key with 4 values, all asked
    niah_multiquery   essays, 4 keys planted, all 4 asked

as RULER's ``synthetic.yaml`` configures them (num_needle_k / v / q). Several asked values
render the template in RULER's plural ("Some special magic numbers are hidden ... What are all
the special magic numbers for K1, K2, and K3 ..."), and the answer must hold every value.

The haystack is the longest that keeps prompt + RULER's generation budget (128 tokens, a quarter
of the length below 512, ``max_new_tokens`` if larger) within the requested length in the model's tokens (binary search,
as RULER does); the essays, concatenated, repeat when a longer haystack is needed, as RULER's.
Answers are generated for ``max_new_tokens`` (16, or 48 with UUIDs: the value and its prefix
fit; RULER's longer budget only costs decode steps). Needles sit at sentence boundaries of the
essays (depth = share of sentences before the needle); in the noise haystack, between repeats.
Score = 100 x share of expected values found in the greedy answer (RULER's string_match_all).

Differences from RULER, by necessity (no network, no extra packages): keys are adjective-noun
pairs from short lists (``hwh_jax.data.ruler``) rather than wonderwords' full lists; sentences
are split by a regular expression rather than NLTK's punkt; the noise haystack puts the needle
at the requested depth (RULER picks a random slot), so that depth can be swept for it too;
with several needles, the first asked needle sits at the requested depth and the others at
depths drawn from RULER's grid of 40 (RULER draws every needle's depth), so depth tables
keep their meaning for every task.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import random
import re
import uuid
from typing import NamedTuple

from hwh_jax import storage
from hwh_jax.data.paths import resolve
from hwh_jax.data.ruler import NEEDLE, NOISE, TOKENS_TO_GENERATE, WORDS, prompt_template, value_type
from hwh_jax.eval.stats import share
from hwh_jax.progress import Progress


class Task(NamedTuple):
    """A RULER NIAH task as its ``synthetic.yaml`` sets it: the haystack ("noise": RULER's
    repeated sentences, "essay", "needle": distractor needles only), the values' and keys'
    types, and how many keys are planted (k), values a key (v) and keys asked (q)."""

    haystack: str
    value: str
    key: str = "words"
    k: int = 1
    v: int = 1
    q: int = 1


TASKS = {
    "niah_single_1": Task("noise", "numbers"),
    "niah_single_2": Task("essay", "numbers"),
    "niah_single_3": Task("essay", "uuids"),
    "niah_multikey_1": Task("essay", "numbers", k=4),
    "niah_multikey_2": Task("needle", "numbers"),
    "niah_multikey_3": Task("needle", "uuids", key="uuids"),
    "niah_multivalue": Task("essay", "numbers", v=4),
    "niah_multiquery": Task("essay", "numbers", k=4, q=4),
}
SINGLE = ("niah_single_1", "niah_single_2", "niah_single_3")  # the default set
DEPTHS = [round(100 * i / 39) for i in range(40)]  # RULER's grid for needles it places


@dataclasses.dataclass
class NiahSample:
    """One rendered NIAH prompt: its task, requested length and needle depth, the text, the
    values the answer must contain, and the prompt's length in the model's tokens."""

    task: str
    length: int  # requested length in tokens (prompt + answer budget)
    depth: int  # percent
    prompt: str
    expected: list[str]
    prompt_tokens: int


@functools.lru_cache(maxsize=4)
def essay_words(folder: str | None = None) -> tuple[str, ...]:
    root = storage.path(folder) if folder else resolve("pg_essays/PaulGrahamEssays")
    files = sorted(
        (
            p
            for p in [*root.glob("*.txt"), *root.glob("*.txt.gz")]
            if p.name not in ("rss.txt", "rss.txt.gz")
        ),
        key=lambda p: p.name.removesuffix(".gz"),
    )
    if not files:
        raise FileNotFoundError(f"no Paul Graham essays (*.txt, *.txt.gz) in {root}")
    text = " ".join(
        (gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()).decode(
            "utf-8", errors="replace"
        )
        for p in files
    )
    return tuple(re.sub(r"\s+", " ", text).strip().split(" "))


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(text) if s]


def _value(kind: str, rng: random.Random) -> str:
    if kind == "words":
        return rng.choice(WORDS)
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def build_context(haystack: str, size: int, placed, essay=None, distractors=()) -> str:
    """A haystack of ``size`` units (essay words, noise sentences or distractor needles) with
    each (needle, depth %) of ``placed`` inserted at its depth."""
    if haystack == "essay":
        units = split_sentences(" ".join(_repeat(essay, size)))
        at = [int(len(units) * d / 100) for _, d in placed]
    else:
        units = [NOISE] * size if haystack == "noise" else list(distractors[:size])
        at = [round(size * d / 100) for _, d in placed]
    # from the last position back, so earlier positions still count the haystack's units
    for i in sorted(range(len(placed)), key=lambda i: (at[i], i), reverse=True):
        units.insert(at[i], placed[i][0])
    return ("\n" if haystack != "essay" else " ").join(units)


def _repeat(words, size: int):
    """The first ``size`` words of the essays, repeated from the start as often as needed."""
    if size <= len(words):
        return words[:size]
    return (words * (size // len(words) + 1))[:size]


def render(task: str, context: str, key) -> str:
    """The prompt as RULER renders it: ``key`` one asked key or a list of them ("K1, K2, and
    K3"), the template singular when one value is asked (RULER's rewrite), plural otherwise."""
    spec = TASKS[task]
    keys = [key] if isinstance(key, str) else list(key)
    query = ", ".join(keys[:-1]) + ", and " + keys[-1] if len(keys) > 1 else keys[0]
    asked = len(keys) * spec.v
    return prompt_template(asked).format(
        type_needle_v=value_type(spec.value, asked), context=context, query=query
    )


class TooShort(ValueError):
    """A NIAH length too short for a task's template and its answer."""


def check_lengths(
    tasks, lengths, tokenizer, *, max_new_tokens: int | None = None, essay_folder: str | None = None
) -> None:
    """Raises ``TooShort`` for the first (task, length) whose template and answer do not fit
    (what ``make_sample`` would raise mid-evaluation), cheaply: one empty haystack each."""
    new = max_new_tokens or answer_budget(tasks)
    for task in tasks:
        for length in sorted(set(lengths)):
            make_sample(
                task,
                length,
                0,
                tokenizer,
                max_new_tokens=new,
                essay_folder=essay_folder,
                fits_only=True,
            )


def make_sample(
    task: str,
    length: int,
    depth: int,
    tokenizer,
    *,
    max_new_tokens: int,
    seed: int | str = 0,
    essay_folder: str | None = None,
    reserve: int = TOKENS_TO_GENERATE,
    fits_only: bool = False,
) -> NiahSample | None:
    """One prompt of at most ``length - max(kept, max_new_tokens)`` tokens with its expected
    answer, ``kept`` = ``reserve`` (RULER's generation budget) but at most a quarter of
    ``length`` (the tiny models' contexts of a few hundred tokens); ``reserve=0`` fills
    ``length`` but for ``max_new_tokens``. ``fits_only``: only check that the template and
    answer fit (``TooShort`` if not), return None."""
    if task not in TASKS:
        raise ValueError(f"unknown NIAH task {task!r}; known: {list(TASKS)}")
    if not 0 <= depth <= 100:
        raise ValueError(f"NIAH depth must be a percentage in [0, 100], got {depth}")
    spec = TASKS[task]
    rng = random.Random(f"{task}-{length}-{depth}-{seed}")
    keys, values = [], []
    for _ in range(max(spec.k, spec.q)):  # as RULER: k planted keys, q of them asked
        keys.append(_value(spec.key, rng))
        values.append([_value(spec.value, rng) for _ in range(spec.v)])
    asked = sorted(rng.sample(range(len(keys)), spec.q)) if len(keys) > 1 else [0]
    order = asked + [i for i in range(len(keys)) if i not in asked]  # the asked needles first
    needles = [
        NEEDLE.format(type_needle_v=spec.value, key=keys[i], value=v)
        for i in order
        for v in values[i]
    ]
    placed = [(needles[0], depth)] + [(n, rng.choice(DEPTHS)) for n in needles[1:]]
    essay = essay_words(essay_folder) if spec.haystack == "essay" else None
    kept = max(min(reserve, length // 4), max_new_tokens)
    budget = length - kept
    distractors = _distractors(spec, f"{task}-{length}-{depth}-{seed}", budget, set(keys))
    query = [keys[i] for i in asked]

    def context(size):
        return build_context(spec.haystack, size, placed, essay, distractors)

    def n_tokens(size):
        return len(tokenizer.encode(render(task, context(size), query)))

    if n_tokens(0) > budget:
        raise TooShort(
            f"{task}: length {length} leaves no room for a haystack (the template "
            f"alone is {n_tokens(0)} tokens + {kept} kept for the answer)"
        )
    if fits_only:
        return None
    # every word / sentence costs at least one token: ``budget`` units is an upper bound
    lo, hi = 0, budget
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if n_tokens(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    prompt = render(task, context(lo), query)
    expected = [v for i in asked for v in values[i]]
    return NiahSample(task, length, depth, prompt, expected, len(tokenizer.encode(prompt)))


def _distractors(spec: Task, seed: str, count: int, planted: set) -> list[str]:
    """RULER's "needle" haystack: needles of random keys and values (none of the planted
    keys), from a stream of their own, so a longer haystack extends a shorter one."""
    if spec.haystack != "needle":
        return []
    rng, out = random.Random(f"{seed}-haystack"), []
    while len(out) < count:
        key = _value(spec.key, rng)
        value = _value(spec.value, rng)
        if key not in planted:
            out.append(NEEDLE.format(type_needle_v=spec.value, key=key, value=value))
    return out


def needle_prompts(tokenizer, length: int, count: int, *, task: str = "niah_single_2"):
    """``count`` NIAH prompts of ``length`` tokens, needles at depths spread over 0-100%, ending
    where the answer starts, and each needle value's token span (start, end): the prompts of the
    QRscore probe (``hwh_jax.analysis.run.qr_scores``). The span starts one token early (the
    value's first token may merge with the space before it)."""
    prompts, spans = [], []
    for s in range(count):
        smp = make_sample(
            task,
            length,
            round(100 * s / max(count - 1, 1)),
            tokenizer,
            max_new_tokens=0,
            seed=s,
            reserve=0,
        )
        at = smp.prompt.index(smp.expected[0])
        lo = len(tokenizer.encode(smp.prompt[:at]))
        hi = len(tokenizer.encode(smp.prompt[: at + len(smp.expected[0])]))
        prompts.append(tokenizer.encode(smp.prompt))
        spans.append((max(lo - 1, 0), hi))
    return prompts, spans


def string_match_all(prediction: str, expected: list[str]) -> float:
    """RULER's metric: 100 x share of expected strings found (case-insensitive) in prediction."""
    pred = prediction.lower()
    return 100.0 * sum(e.lower() in pred for e in expected) / len(expected)


def answer_budget(tasks) -> int:
    """Tokens generated per NIAH prompt: 16 a number or 48 a UUID asked, for the task of the
    set that asks the most (16 or 48 for the single tasks)."""
    return max((48 if TASKS[t].value == "uuids" else 16) * TASKS[t].q * TASKS[t].v for t in tasks)


def prompt_seed(run_seed: int, sample: int):
    """The seed of a prompt's key and value: ``sample`` for run seed 0 (the prompts of the
    committed results), ``"<run seed>/<sample>"`` otherwise, a stream of its own per seed."""
    return sample if run_seed == 0 else f"{run_seed}/{sample}"


def run_niah(
    generator,
    tokenizer,
    *,
    tasks,
    lengths,
    depths,
    samples: int = 1,
    max_new_tokens: int | None = None,
    batch_size: int = 8,
    log=print,
    on_length=None,
    seed: int = 0,
):
    """Generate, answer greedily and score every (task, length, depth, sample).
    ``seed``: the run's seed, drawn into every prompt's key and value (``prompt_seed``), so
    runs of different seeds are asked different prompts.

    All tasks of one length share one batch shape (short batches are filled with copies), and
    one answer budget: ``max_new_tokens`` or 48 when a UUID task is in the set, else 16; so
    each length compiles one prefill and one decode. ``on_length(rows so far)`` is called after
    each length. Returns rows {task, length, depth, sample, score, prediction, expected,
    prompt_tokens}."""
    new = max_new_tokens or answer_budget(tasks)
    rows = []
    progress = Progress(len(lengths) * len(tasks) * len(depths) * samples, "niah", unit="prompt")
    for length in lengths:
        batch = [
            make_sample(t, length, d, tokenizer, max_new_tokens=new, seed=prompt_seed(seed, s))
            for t in tasks
            for d in depths
            for s in range(samples)
        ]
        sample_ids = [s for t in tasks for d in depths for s in range(samples)]
        for i in range(0, len(batch), batch_size):
            part = batch[i : i + batch_size]
            prompts = [tokenizer.encode(b.prompt) for b in part]
            prompts += [prompts[-1]] * (batch_size - len(prompts))  # one shape per length
            outs, _ = generator.generate(prompts, new)
            for j, (b, out) in enumerate(zip(part, outs)):
                pred = tokenizer.decode(out)
                rows.append(
                    {
                        "task": b.task,
                        "length": length,
                        "depth": b.depth,
                        "sample": sample_ids[i + j],
                        "score": string_match_all(pred, b.expected),
                        "prediction": pred,
                        "expected": b.expected,
                        "prompt_tokens": b.prompt_tokens,
                    }
                )
            progress.update(len(part))
        for t in tasks:
            cell = share([r["score"] for r in rows if r["task"] == t and r["length"] == length])
            log(
                f"niah {t} @ {length}: {cell['mean']:.1f} over {cell['n']} prompts ({cell['right']} "
                f"right, 95% interval {cell['lo']:.0f}-{cell['hi']:.0f}%)"
            )
        if on_length is not None:
            on_length(list(rows))
    progress.close()
    return rows
