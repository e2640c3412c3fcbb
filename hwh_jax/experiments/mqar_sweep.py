"""MQAR as a training task: Zoology's sweep of recall against model width (Arora et al., 2023).

For each architecture and width a 2-layer model (``sweep_config``: ``heads`` heads a layer of
width / heads dimensions, a SwiGLU of 2 x width) is trained on multi-query associative recall
(``hwh_jax.eval.mqar``: keys and values from a vocabulary of 8,192, the value the target at each
query, every other position outside the loss) and scored on fresh sequences of every
(sequence length, key-value pairs) setting. As in Zoology's own configs, one model learns all
settings at once: each batch mixes them (Zoology pads every row to the longest; here each
setting's rows are a group of their own length, the same loss for a causal model at about half
the tokens), and the LM head runs at the query positions only.

Every (seed, learning rate) pair of one architecture and width is one trial, and the trials
train as one program: the step is ``vmap``-ed over their parameters, optimizer states and
learning rates (the data is shared), so a sweep costs one compile per (architecture, width).
As Zoology reports, each seed's score is that of its best learning rate, chosen on a
validation set of other sequences and reported on a test set; a cell is the mean over seeds with
their standard deviation, and the share of test queries answered right pooled over the seeds
with its 95% Wilson interval.

``--mode=zoology`` (``zoology_spec``) is Zoology's own Figure 2 instead (its configs,
``iclr24_zoology_figure2``): a model per (architecture, width, setting), trained on a fixed set
of 100,000 examples of that setting for 64 epochs at Zoology's batch (512 sequences up to
T = 128, 256 at 256, 128 at 512), learning rates 1e-4 to 1e-2 (four, log-spaced), AdamW with
PyTorch's defaults (weight decay 0.01, betas 0.9 / 0.999, no clipping) and a cosine to 0 without
warm-up, no noise tokens between the queries (``random_non_queries=False``), no MLP, and its
heads and positions: attention one head with learned absolute positions, GDN two heads (short
convolution, no positions), HwH one NoPE FA head beside one GDN head. Left from Zoology: its
attention's dropout of 0.1, the BaseConv layer it puts in front of GDN, its cosine stepped once
an epoch (here every step) and its last partial batch of an epoch (dropped here); it picks the
learning rate on its test set, this on a validation set of other sequences.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from hwh_jax import storage
from hwh_jax.eval import stats
from hwh_jax.eval.mqar import IGNORE, multiquery_ar
from hwh_jax.layers.config import LayerSpec, ModelConfig
from hwh_jax.layers.loss import token_nll
from hwh_jax.models.lm import HybridLM
from hwh_jax.models.params import count_params
from hwh_jax.models.variants import build_layers
from hwh_jax.plotting import pyplot, save_figure
from hwh_jax.training.optimizer import OptimizerSpec, make_optimizer
from hwh_jax.training.signals import StopOnSignal
from hwh_jax.training.state import init_train_state

ARCHS = ("transformer", "gdn", "layerwise", "hwh", "hwh_rope")
MODES = ("mixed", "zoology")
ZOOLOGY_ARCHS = ("transformer", "gdn", "hwh")


def zoology_batch(length: int) -> int:
    """Zoology's Figure 2 batch for sequences of ``length`` tokens."""
    return 64 if length >= 1024 else 128 if length >= 512 else 256 if length >= 256 else 512


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """What the sweep trains and scores (defaults: Zoology's settings of its width figure)."""

    archs: tuple = ("transformer", "gdn", "layerwise", "hwh", "hwh_rope")
    widths: tuple = (64, 128, 256, 512)
    settings: tuple = ((64, 4), (128, 8), (256, 16), (512, 64))  # (sequence length, pairs)
    vocab: int = 8192
    heads: int = 4  # heads a layer; HwH: 1 FA + 3 GDN in each of its 2 layers
    steps: int = 6000
    batch_size: int = 64
    lrs: tuple = (1e-3, 3e-3, 1e-2)
    seeds: tuple = (0, 1, 2)
    warmup_steps: int = 100
    weight_decay: float = 0.1
    eval_examples: int = 256  # per setting, validation and test each
    dtype: str = "bfloat16"
    mode: str = "mixed"  # "mixed": the settings in one model; "zoology": Zoology's Figure 2
    train_examples: int = 0  # zoology: a fixed training set of this many examples a setting
    epochs: int = 0  # zoology: passes over it (steps = epochs x train_examples // batch)

    def validate(self):
        if self.mode not in MODES:
            raise ValueError(f"--mode: {self.mode!r} is not one of {MODES}")
        zoology = self.mode == "zoology"
        archs = ZOOLOGY_ARCHS if zoology else ARCHS
        for arch in self.archs:
            if arch not in archs:
                raise ValueError(f"--archs: {arch!r} is not one of {archs} (--mode={self.mode})")
        for w in self.widths:
            if zoology and w % 4:
                raise ValueError(f"--widths: {w} must be a multiple of 4 in --mode=zoology")
            if not zoology and (w < self.heads or w % self.heads or (w // self.heads) % 2):
                raise ValueError(
                    f"--widths: {w} must split into --heads={self.heads} heads of an even dimension"
                )
        if zoology:
            if self.train_examples < 1 or self.epochs < 1:
                raise ValueError(
                    f"--mode=zoology trains a fixed set: --train_examples "
                    f"({self.train_examples}) and --epochs ({self.epochs}) must be >= 1"
                )
            for i in range(len(self.settings)):
                one = self.for_setting(i)
                if one.batch_size > self.train_examples:
                    raise ValueError(
                        f"--train_examples={self.train_examples} is fewer than a batch of "
                        f"{one.batch_size} (--batch_size)"
                    )
        for length, pairs in self.settings:
            if pairs * 4 > length or length >= self.vocab:
                raise ValueError(
                    f"--settings: {pairs} pairs in {length} tokens (need 4 x pairs "
                    f"<= length < --vocab={self.vocab})"
                )
        for name in ("steps", "batch_size", "eval_examples")[2 * zoology :]:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if not self.lrs or not self.seeds or min(self.lrs) <= 0:
            raise ValueError(f"--lrs (> 0) and --seeds must be non-empty: {self.lrs}, {self.seeds}")

    @property
    def max_len(self) -> int:
        return max(length for length, _ in self.settings)

    def for_setting(self, i: int) -> "SweepSpec":
        """Zoology mode: the spec of setting ``i``'s own models: that setting alone, its batch
        (``batch_size``, or 0 for Zoology's by length) and the steps of ``epochs`` passes."""
        length, pairs = self.settings[i]
        batch = self.batch_size or zoology_batch(length)
        return dataclasses.replace(
            self,
            settings=((length, pairs),),
            batch_size=batch,
            steps=self.epochs * (self.train_examples // batch),
        )


def zoology_spec(**overrides) -> SweepSpec:
    """Zoology's Figure 2 (module docstring), with ``overrides`` (e.g. fewer widths)."""
    spec = dict(
        mode="zoology",
        archs=ZOOLOGY_ARCHS,
        widths=(64, 128, 256, 512),
        settings=((64, 4), (128, 8), (256, 16), (512, 64)),
        lrs=tuple(float(x) for x in np.logspace(-4, -2, 4)),
        train_examples=100_000,
        epochs=64,
        batch_size=0,  # Zoology's by sequence length
        steps=0,  # from the epochs
        eval_examples=3_000,
        warmup_steps=0,
        weight_decay=0.01,
    )
    return SweepSpec(**{**spec, **overrides})


def sweep_config(arch: str, width: int, spec: SweepSpec) -> ModelConfig:
    """The 2-layer model of ``arch`` at ``width``: layer-wise = one FA layer after one GDN layer,
    HwH = 1 FA head (NoPE, or RoPE for hwh_rope) beside heads - 1 GDN heads in each layer (the
    full-size rules, an FA share below 1/4 and no FA heads in the first and last layer, cannot
    hold in two layers)."""
    if spec.mode == "zoology":
        return _zoology_config(arch, width, spec)
    h = spec.heads
    if arch in ("hwh", "hwh_rope"):
        layers = tuple(LayerSpec(1, h - 1, fa_rope=arch == "hwh_rope") for _ in range(2))
    else:
        layers = build_layers(arch, 2, h, ratio=(1, 1))
    return ModelConfig(
        vocab_size=spec.vocab,
        d_model=width,
        num_heads=h,
        head_dim=width // h,
        la_key_dim=width // h,
        la_value_dim=width // h,
        mlp_hidden=-(-2 * width // 64) * 64,
        layers=layers,
        arch=arch,
        dtype=spec.dtype,
        la_chunk_size=min(64, spec.max_len),
    )


def _zoology_config(arch: str, width: int, spec: SweepSpec) -> ModelConfig:
    """Zoology's 2-layer models without an MLP: attention one head with learned absolute
    positions (its ``max_position_embeddings``), GDN two heads, HwH one NoPE FA head beside one
    GDN head (each half the width)."""
    heads = {"transformer": (1, 0), "gdn": (0, 2), "hwh": (1, 1)}[arch]
    dim = width // sum(heads)
    return ModelConfig(
        vocab_size=spec.vocab,
        d_model=width,
        num_heads=sum(heads),
        head_dim=dim,
        la_key_dim=dim,
        la_value_dim=dim,
        mlp_hidden=0,
        layers=(LayerSpec(*heads),) * 2,
        abs_positions=spec.max_len if arch == "transformer" else 0,
        arch=arch,
        dtype=spec.dtype,
        la_chunk_size=min(64, spec.max_len),
    )


def _setting_rows(spec: SweepSpec, i: int, n: int, seed: int):
    """``n`` rows of setting ``i`` at its own length: inputs [n, T_i], and each row's query
    positions and answers [n, pairs_i] (int32)."""
    length, pairs = spec.settings[i]
    noise = spec.mode != "zoology"  # Zoology's Figure 2: zeros between the queries
    b = multiquery_ar(spec.vocab, n, length, pairs, random_non_queries=noise, seed=seed * 1009 + i)
    rows, where = np.nonzero(b.labels != IGNORE)  # row-major: each row's in order
    if len(rows) != n * pairs:
        raise AssertionError(
            f"MQAR rows of {pairs} pairs hold {len(rows)} queries, not {n * pairs}"
        )
    where = where.reshape(n, pairs).astype(np.int32)
    return b.inputs, where, np.take_along_axis(b.labels, where, axis=1)


def train_batch(spec: SweepSpec, step: int, data_seed: int = 0) -> tuple:
    """Step ``step``'s batch: the settings mixed evenly (the remainder to the first ones), one
    (inputs, where, answers) group per setting at its own length, so no row is padded (Zoology pads
    every row to the longest; a causal model's predictions before a row's end do not depend on
    the padding after it, so the loss is the same, at about half the tokens). With
    ``train_examples`` (Zoology mode, one setting): the next ``batch_size`` rows of the fixed
    training set in this epoch's order."""
    if spec.train_examples:
        inputs, where, answers = _training_set(spec, data_seed)
        per_epoch = spec.train_examples // spec.batch_size
        epoch, k = divmod(step, per_epoch)
        order = _epoch_order(spec.train_examples, data_seed, epoch)
        rows = order[k * spec.batch_size : (k + 1) * spec.batch_size]
        return ((inputs[rows], where[rows], answers[rows]),)
    k, r = divmod(spec.batch_size, len(spec.settings))
    seed = 1_000_000 * (data_seed + 1) + step
    return tuple(
        _setting_rows(spec, i, k + (i < r), seed) for i in range(len(spec.settings)) if k + (i < r)
    )


@functools.lru_cache(maxsize=2)
def _epoch_order(n: int, data_seed: int, epoch: int) -> np.ndarray:
    """The order of the fixed training set in ``epoch`` (drawn once an epoch, not a step)."""
    return np.random.default_rng((data_seed, epoch)).permutation(n)


@functools.lru_cache(maxsize=2)
def _training_set(spec: SweepSpec, data_seed: int):
    """Zoology mode: the fixed training examples of the spec's one setting."""
    return _setting_rows(spec, 0, spec.train_examples, 3 + data_seed)


def eval_set(spec: SweepSpec, split: str) -> tuple:
    """The validation or test sequences: ``eval_examples`` of every setting, a group each."""
    seed = {"validation": 1, "test": 2}[split]  # training batches use seeds >= 1,000,000
    return tuple(
        _setting_rows(spec, i, spec.eval_examples, seed) for i in range(len(spec.settings))
    )


def _trial_steps(cfg: ModelConfig, spec: SweepSpec):
    """(init(seeds) -> states, step(states, lrs, groups) -> (states, losses), hits(states,
    inputs, where, answers) -> [trials, N] correct queries a row): every function over a leading
    trial axis; ``groups`` a tuple of (inputs, where, answers) of any lengths, the loss the mean
    over all their queries."""
    zoology = spec.mode == "zoology"  # torch's AdamW defaults, a cosine to 0
    opt = OptimizerSpec(
        lr=1.0,
        min_lr_ratio=0.0 if zoology else 0.1,
        warmup_steps=spec.warmup_steps,
        total_steps=spec.steps,
        weight_decay=spec.weight_decay,
        **(dict(b2=0.999, clip_norm=0.0) if zoology else {}),
    )
    tx, schedule = make_optimizer(opt)  # unit peak: each trial scales by its own lr
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0))), nnx.Param)

    def init(seed):
        s = init_train_state(cfg, tx, seed)
        return {"params": s["params"], "opt_state": s["opt_state"]}

    def at_queries(model, x, where):
        """Hidden states at the query positions only: the LM head, most of a small model's
        work, runs on them and not on every position."""
        return jnp.take_along_axis(model.hidden(x), where[..., None], axis=1)

    def loss_fn(params, groups):
        model = nnx.merge(graphdef, params)
        total, count = 0.0, 0
        for x, where, answers in groups:
            nll, _ = token_nll(model.logits(at_queries(model, x, where), dtype=None), answers)
            total, count = total + nll.sum(), count + answers.size
        return total / count

    def step(state, lr, groups):
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], groups)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        updates = jax.tree.map(lambda u: u * lr, updates)
        return {
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
        }, loss

    def hits(state, x, where, answers):
        model = nnx.merge(graphdef, state["params"])
        pred = jnp.argmax(model.logits(at_queries(model, x, where), dtype=jnp.float32), -1)
        return (pred == answers).sum(-1)

    return (
        jax.jit(jax.vmap(init)),
        jax.jit(jax.vmap(step, in_axes=(0, 0, None)), donate_argnums=0),
        jax.jit(jax.vmap(hits, in_axes=(0, None, None, None))),
        schedule,
    )


def _score(hits_fn, states, groups, spec, batch):
    """Correct queries per (trial, setting) and queries per setting."""
    right = np.zeros((len(spec.seeds) * len(spec.lrs), len(spec.settings)), np.int64)
    for s, group in enumerate(groups):
        for i in range(0, len(group[0]), batch):
            right[:, s] += np.asarray(hits_fn(states, *(a[i : i + batch] for a in group))).sum(-1)
    return right, np.array([g[2].size for g in groups])


class Stopped(Exception):
    """A signal stopped the sweep inside a cell; its trials' state is saved to continue."""


def _save_partial(path: storage.PathLike, states, step: int, seconds: float):
    """The trials' parameters and optimizer states after ``step`` steps, written atomically
    (floats narrower than fp32 stored as fp32: exact)."""
    leaves = [
        np.asarray(
            x.astype(jnp.float32)
            if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize < 4
            else x
        )
        for x in jax.tree.leaves(states)
    ]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, step=step, seconds=seconds, **{f"leaf{i}": x for i, x in enumerate(leaves)})
    tmp.replace(path)


def _load_partial(path: storage.PathLike, states):
    """(states, step, seconds) from ``_save_partial``'s file, every leaf checked against the
    freshly initialised ``states`` (another spec's file is an error naming it)."""
    with np.load(path) as f:
        leaves, tree = jax.tree.flatten(states)
        saved = (
            [f[f"leaf{i}"] for i in range(len(leaves))] if len(f.files) == len(leaves) + 2 else None
        )
        if saved is None or any(x.shape != y.shape for x, y in zip(saved, leaves)):
            raise ValueError(
                f"{path} holds the trials of another sweep spec; delete it or use another --out"
            )
        restored = [jnp.asarray(x).astype(y.dtype) for x, y in zip(saved, leaves)]
        return jax.tree.unflatten(tree, restored), int(f["step"]), float(f["seconds"])


def run_cell(
    arch: str,
    width: int,
    spec: SweepSpec,
    log=print,
    partial: storage.PathLike | None = None,
    save_every: int = 1000,
    stop=None,
) -> dict:
    """Train every (seed, lr) trial of ``arch`` at ``width`` as one program; score them.
    ``partial``: a file the trials' state is saved to every ``save_every`` steps and when
    ``stop.signal`` is set (then ``Stopped`` is raised), and continued from when it exists
    (the batches depend on the step only, so a continued cell trains as an uninterrupted one)."""
    cfg = sweep_config(arch, width, spec)
    init, step, hits, _ = _trial_steps(cfg, spec)
    trials = [(s, lr) for s in spec.seeds for lr in spec.lrs]
    states = init(jnp.asarray([s for s, _ in trials], jnp.int32))
    lrs = jnp.asarray([lr for _, lr in trials], jnp.float32)
    start, before = 0, 0.0
    if partial is not None and partial.exists():
        states, start, before = _load_partial(partial, states)
        log(f"  {arch} d={width}: continuing from step {start} ({partial.name})")
    t0, losses = time.time() - before, None
    every = max(spec.steps // 4, 1)
    for t in range(start, spec.steps):
        states, losses = step(states, lrs, train_batch(spec, t))
        done = t + 1
        if stop is not None and stop.signal and done < spec.steps:
            _save_partial(partial, states, done, time.time() - t0)
            raise Stopped(
                f"stopped by {stop.signal} at step {done}/{spec.steps} of {arch} "
                f"d={width}; its trials are saved in {partial}: the same command "
                f"continues the sweep"
            )
        if partial is not None and done % save_every == 0 and done < spec.steps:
            _save_partial(partial, states, done, time.time() - t0)
        if done % every == 0 or done == spec.steps:
            loss = np.asarray(losses)
            log(
                f"  {arch} d={width}: step {done}/{spec.steps}, loss "
                f"{loss.min():.3f}-{loss.max():.3f} over {len(trials)} trials "
                f"({time.time() - t0:.0f}s)"
            )
    if losses is None:
        raise ValueError(f"{partial} is at step {start}, not before the sweep's {spec.steps}")
    if not np.all(np.isfinite(np.asarray(losses))):
        log(f"  {arch} d={width}: a non-finite loss in some trial (its scores are what they are)")
    batch = max(spec.batch_size, 1)
    val, _ = _score(hits, states, eval_set(spec, "validation"), spec, batch)
    test, queries = _score(hits, states, eval_set(spec, "test"), spec, batch)
    rows = []
    for si, seed in enumerate(spec.seeds):
        idx = [si * len(spec.lrs) + li for li in range(len(spec.lrs))]
        best = max(idx, key=lambda i: val[i].sum())
        for s, (length, pairs) in enumerate(spec.settings):
            rows.append(
                {
                    "arch": arch,
                    "width": width,
                    "seq_len": length,
                    "pairs": pairs,
                    "seed": seed,
                    "lr": trials[best][1],
                    "right": int(test[best, s]),
                    "queries": int(queries[s]),
                    "accuracy": float(test[best, s] / queries[s]),
                    "final_loss": float(np.asarray(losses)[best]),
                }
            )
    return {
        "arch": arch,
        "width": width,
        "params": int(count_params(cfg)),
        "rows": rows,
        "seconds": time.time() - t0,
    }


def summarize(rows: list[dict]) -> list[dict]:
    """One cell per (arch, width, setting): the seeds' accuracies, mean, sd, and the pooled
    share right with its 95% Wilson interval."""
    cells = {}
    for r in rows:
        cells.setdefault((r["arch"], r["width"], r["seq_len"], r["pairs"]), []).append(r)
    out = []
    for (arch, width, length, pairs), rs in cells.items():
        acc = [r["accuracy"] for r in rs]
        right, n = sum(r["right"] for r in rs), sum(r["queries"] for r in rs)
        lo, hi = stats.wilson(right, n)
        out.append(
            {
                "arch": arch,
                "width": width,
                "seq_len": length,
                "pairs": pairs,
                "seeds": len(rs),
                "accuracies": acc,
                "mean": statistics.mean(acc),
                "std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                "queries": n,
                "lo": lo,
                "hi": hi,
                "lrs": [r["lr"] for r in rs],
            }
        )
    return out


def table(cells: list[dict]) -> str:
    """Markdown: a row per (arch, width), a column per setting: mean +- sd [pooled interval]."""
    settings = sorted({(c["seq_len"], c["pairs"]) for c in cells})
    by = {(c["arch"], c["width"], c["seq_len"], c["pairs"]): c for c in cells}
    rows = sorted({(c["arch"], c["width"]) for c in cells}, key=lambda k: (k[0], k[1]))
    lines = [
        "| arch | width | " + " | ".join(f"T={t}, {p} pairs" for t, p in settings) + " |",
        "|---|---:|" + "---:|" * len(settings),
    ]
    for arch, width in rows:
        cells_ = [by.get((arch, width, t, p)) for t, p in settings]
        lines.append(
            f"| {arch} | {width} | "
            + " | ".join(
                "-"
                if c is None
                else f"{100 * c['mean']:.1f} +- {100 * c['std']:.1f} "
                f"[{100 * c['lo']:.1f}-{100 * c['hi']:.1f}]"
                for c in cells_
            )
            + " |"
        )
    return "\n".join(lines)


def figure(cells: list[dict], path: storage.PathLike):
    """Zoology's figure: a panel per sequence length, accuracy against width (log), a line per
    architecture through the mean over seeds and every seed's accuracy as a dot (three seeds
    tell more than a standard deviation: one seed that has not learned shows as a lone dot)."""
    plt = pyplot()
    settings = sorted({(c["seq_len"], c["pairs"]) for c in cells})
    archs = sorted({c["arch"] for c in cells})
    fig, axes = plt.subplots(
        1, len(settings), figsize=(3.2 * len(settings), 3.2), sharey=True, squeeze=False
    )
    for ax, (length, pairs) in zip(axes[0], settings):
        for i, arch in enumerate(archs):
            cs = sorted(
                (
                    c
                    for c in cells
                    if c["arch"] == arch and c["seq_len"] == length and c["pairs"] == pairs
                ),
                key=lambda c: c["width"],
            )
            shift = 2 ** (0.06 * (i - (len(archs) - 1) / 2))  # apart on the log axis
            (line,) = ax.plot(
                [c["width"] * shift for c in cs],
                [c["mean"] for c in cs],
                marker="o",
                ms=3,
                label=arch,
            )
            ax.plot(
                [c["width"] * shift for c in cs for _ in c["accuracies"]],
                [a for c in cs for a in c["accuracies"]],
                ls="none",
                marker=".",
                ms=4,
                alpha=0.5,
                color=line.get_color(),
            )
        ax.set_xscale("log", base=2)
        widths = sorted({c["width"] for c in cells})
        ax.set_xticks(widths, [str(w) for w in widths])  # the widths trained, at their ticks
        ax.minorticks_off()
        ax.set_xlim(widths[0] / 1.6, widths[-1] * 1.6)  # points off the axis edges
        ax.set_title(f"T={length}, {pairs} pairs", fontsize=9)
        ax.set_xlabel("model width")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy (line: mean; dots: seeds)")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def _differences(spec: dict, other: dict):
    """(key, value, other's value) for each field of two saved specs that differs, but the
    architectures and widths (sweeps of other cells of the same settings may be joined)."""
    return [
        (k, v, other.get(k))
        for k, v in spec.items()
        if k not in ("archs", "widths") and v != other.get(k)
    ]


def sweep(spec: SweepSpec, out: storage.PathLike, log=print, save_every: int = 1000) -> list[dict]:
    """Run every (arch, width) cell; ``out``/results.json (rows, cells, spec), table.md and
    mqar_sweep.png, rewritten after each cell so a cut sweep keeps what it measured.

    Run again into the same ``out`` with the same spec, it continues: the cells in results.json
    are kept, and a cell cut by SIGTERM / SIGINT (or a kill: its last ``save_every``) goes on
    from its saved trials (``out``/partial_ARCH_WIDTH.npz, deleted once the cell is done)."""
    spec.validate()
    if save_every < 1:
        raise ValueError(f"--save_every must be >= 1, got {save_every}")
    out = storage.path(out)
    out.mkdir(parents=True, exist_ok=True)
    cells_done, rows = [], []
    if (out / "results.json").exists():
        before = json.loads((out / "results.json").read_text())
        mine = json.loads(json.dumps(dataclasses.asdict(spec)))
        for key, value, other in _differences(before["spec"], mine):
            raise ValueError(
                f"{out} holds a sweep with {key}={value!r}, not {other!r}: use "
                f"another --out for other settings"
            )
        cells_done, rows = before["runs"], before["rows"]
    kept = {_cell_key(r) for r in cells_done}
    zoology = spec.mode == "zoology"
    todo = [  # (arch, width, the spec its models train under, its setting in zoology mode)
        (a, w, spec.for_setting(i) if zoology else spec, spec.settings[i] if zoology else None)
        for a in spec.archs
        for w in spec.widths
        for i in range(len(spec.settings) if zoology else 1)
    ]
    with StopOnSignal("saving the trials and stopping after this step") as stop:
        for i, (arch, width, cell_spec, setting) in enumerate(todo):
            name = f"{arch} d={width}" + (f" T={setting[0]}:{setting[1]}" if setting else "")
            at = f"[{i + 1}/{len(todo)}] {name}"
            if (arch, width, setting) in kept:
                log(f"{at}: in {out / 'results.json'} already")
                continue
            if stop.signal:
                raise Stopped(
                    f"stopped by {stop.signal} before {name}; the same command continues the sweep"
                )
            log(
                f"{at}: {len(spec.seeds)} seeds x {len(spec.lrs)} learning rates, "
                f"{cell_spec.steps} steps of {cell_spec.batch_size}"
            )
            suffix = f"_{setting[0]}_{setting[1]}" if setting else ""
            partial = out / f"partial_{arch}_{width}{suffix}.npz"
            cell = run_cell(
                arch, width, cell_spec, log=log, partial=partial, save_every=save_every, stop=stop
            )
            if setting:
                cell.update(seq_len=setting[0], pairs=setting[1])
            rows += cell["rows"]
            cells_done.append({k: v for k, v in cell.items() if k != "rows"})
            _write(out, dataclasses.asdict(spec), cells_done, rows)
            partial.unlink(missing_ok=True)
            mean = statistics.mean(r["accuracy"] for r in cell["rows"])
            log(
                f"{at}: mean accuracy {mean:.3f} over {len(cell_spec.settings)} "
                f"settings and the seeds ({cell['seconds']:.0f}s)"
            )
    return summarize(rows)


def _cell_key(run: dict) -> tuple:
    """A finished run's cell: (arch, width, None), or (arch, width, (T, pairs)) in Zoology
    mode, where each setting is a model of its own."""
    setting = (run["seq_len"], run["pairs"]) if "seq_len" in run else None
    return run["arch"], run["width"], setting


def merge(folders: list[storage.PathLike], out: storage.PathLike) -> list[dict]:
    """Sweeps run apart (one process per architecture, side by side) as one: their rows
    summarised together into ``out``'s results.json, table.md and mqar_sweep.png. Every spec
    field but the architectures and widths must agree (else the error names the field); a cell
    (architecture, width) found in two folders is an error too. A folder that is itself a merge
    counts as the folders it came from (``merged_from`` lists the sweeps' own folders)."""
    loaded = []
    for folder in folders:
        path = storage.path(folder) / "results.json"
        if not path.exists():
            raise FileNotFoundError(
                f"--report: {path} does not exist (a sweep's --out folder holds it)"
            )
        loaded.append((path, json.loads(path.read_text())))
    first_path, first = loaded[0]
    spec = dict(first["spec"])
    runs, rows, seen, sources = [], [], {}, []
    for (path, res), folder in zip(loaded, folders):
        sources += res.get("merged_from", [str(folder)])
        for key, value, other in _differences(res["spec"], first["spec"]):
            raise ValueError(
                f"--report: {path} has {key}={value!r}, {first_path} "
                f"{other!r}: sweeps of other settings"
            )
        for run in res["runs"]:
            cell = _cell_key(run)
            if cell in seen:
                raise ValueError(f"--report: {cell[0]} d={cell[1]} is in {seen[cell]} and {path}")
            seen[cell] = path
        runs += res["runs"]
        rows += res["rows"]
    out = storage.path(out)
    out.mkdir(parents=True, exist_ok=True)
    return _write(out, spec, runs, rows, merged_from=sources)


def _write(
    out: storage.PathLike, spec: dict, runs: list[dict], rows: list[dict], **extra
) -> list[dict]:
    """results.json (the spec with the architectures and widths of ``runs``, the runs, the
    cells summarised from ``rows``, the rows and ``extra``), table.md and mqar_sweep.png into
    ``out``; the cells."""
    spec = {
        **spec,
        "archs": list(dict.fromkeys(r["arch"] for r in runs)),
        "widths": sorted({r["width"] for r in runs}),
    }
    cells = summarize(rows)
    (out / "results.json").write_text(
        json.dumps({"spec": spec, "runs": runs, "cells": cells, "rows": rows, **extra}, indent=1)
    )
    (out / "table.md").write_text(table(cells) + "\n")
    figure(cells, out / "mqar_sweep.png")
    return cells
