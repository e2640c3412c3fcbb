"""Experiment summaries and the cross-architecture report (docs/results.md's tables and figures).

An experiment is one ``launch.train`` workdir whose closing evaluation ran (``config.eval``):
``summary.json`` (params, tokens, wall time), ``metrics.jsonl`` (throughput rows) and
``eval/results.json`` (NIAH rows, MQAR, perplexity by position). ``summarize`` folds them into
one dict (written as ``experiment.json``); ``report`` turns several into markdown tables and the
cross-model NIAH and perplexity figures.
"""

from __future__ import annotations

import json
import math
import statistics

from hwh_jax import storage
from hwh_jax.eval import commonsense, stats
from hwh_jax.eval.suite import compare
from hwh_jax.metrics import read_metrics
from hwh_jax.plotting import finish_line_chart, pyplot


def summarize(workdir: storage.PathLike) -> dict:
    """One experiment's figures from its workdir (errors name the missing file)."""
    workdir = storage.path(workdir)
    for need in ("summary.json", "metrics.jsonl", "eval/results.json"):
        if not (workdir / need).exists():
            raise FileNotFoundError(
                f"{workdir} has no {need}: not a finished run with its "
                f"closing evaluation (config.eval.at_end)"
            )
    summary = json.loads((workdir / "summary.json").read_text())
    results = json.loads((workdir / "eval" / "results.json").read_text())
    tps, mfu = _steady(read_metrics(workdir / "metrics.jsonl"))
    out = {
        "name": run_name(workdir),
        "arch": summary["arch"],
        "params": summary["params"],
        "train_len": results["train_len"],
        "steps": summary["steps"],
        "tokens": summary["tokens"],
        "wall_s": summary["wall_s"],
        "devices": summary["devices"],
        "heldout_loss": summary["final_heldout_loss"],
        "tokens_per_s": statistics.median(tps) if tps else None,
        "mfu": statistics.median(mfu) if mfu else None,
        "niah": results.get("niah_summary", {}),
        "niah_intervals": results.get("niah_intervals", {}),
        "mqar": {
            f"{r['seq_len']}x{r['num_kv_pairs']}": r["accuracy"] for r in results.get("mqar", [])
        },
        "retrieval": results.get("retrieval"),
        "retrieval_trained": results.get("retrieval_trained_format"),  # another wording's
        "eval_finished": results.get("finished", True),  # False: cut during the evaluation
        "results": results,
    }
    return out


def over_seeds(exps: list[dict]) -> dict:
    """One configuration trained with several seeds (``exps``: their ``summarize`` dicts): for
    each NIAH cell every seed's mean score, their mean, sample standard deviation, min and max,
    and the share right pooled over all seeds' prompts (n, 95% Wilson interval; prompts of
    different seeds are treated as one sample, so the seeds' spread is the figure to read for
    the variation between trainings); MQAR mean accuracy and held-out loss the same way."""

    def spread(values):
        values = [v for v in values if v is not None]
        if not values:
            return None
        return {
            "values": values,
            "mean": statistics.mean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values),
            "max": max(values),
            "seed_interval": stats.seeds_interval(values),  # the seed as the unit
        }

    out = {
        "seeds": len(exps),
        "names": [e["name"] for e in exps],
        "arch": exps[0]["arch"],
        "train_len": exps[0]["train_len"],
        "niah": {},
    }
    for k in sorted({k for e in exps for k in e["niah"]}):
        cell = spread([e["niah"].get(k) for e in exps])
        ivs = [e["niah_intervals"][k] for e in exps if k in e.get("niah_intervals", {})]
        if ivs:
            cell["pooled"] = _pooled(sum(i["right"] for i in ivs), sum(i["n"] for i in ivs))
        out["niah"][k] = cell
    lengths = sorted({int(k.split("@")[1]) for e in exps for k in e.get("niah_intervals", {})})
    out["niah_by_length"] = {}  # all tasks of a length together
    for length in lengths:
        per_seed = []
        for e in exps:
            ivs = [
                iv
                for k, iv in e.get("niah_intervals", {}).items()
                if int(k.split("@")[1]) == length
            ]
            if ivs:
                per_seed.append((sum(i["right"] for i in ivs), sum(i["n"] for i in ivs)))
        cell = spread([100 * r / n for r, n in per_seed])
        cell["pooled"] = _pooled(sum(r for r, _ in per_seed), sum(n for _, n in per_seed))
        out["niah_by_length"][str(length)] = cell
    out["mqar"] = spread([statistics.mean(e["mqar"].values()) if e["mqar"] else None for e in exps])
    out["heldout_loss"] = spread([e["heldout_loss"] for e in exps])
    return out


def _pooled(right: int, n: int) -> dict:
    """Prompts right of n pooled over seeds, with the 95% Wilson interval in percent."""
    lo, hi = stats.wilson(right, n)
    return {"n": n, "right": right, "lo": 100 * lo, "hi": 100 * hi}


def fmt_spread(cell: dict | None, spec: str = ".0f") -> str:
    """ "73 +- 6 (66-79) [70-76] n=300": mean +- sd over seeds (min-max), pooled interval, n."""
    if cell is None:
        return "-"
    text = (
        f"{cell['mean']:{spec}} +- {cell['std']:{spec}} ({cell['min']:{spec}}-{cell['max']:{spec}})"
    )
    if "pooled" in cell:
        p = cell["pooled"]
        text += f" [{p['lo']:.0f}-{p['hi']:.0f}] n={p['n']}"
    return text


def seeds_table(groups: list[dict]) -> str:
    """Rows: configurations trained with several seeds (``over_seeds`` dicts); columns: NIAH
    cells, MQAR mean accuracy and held-out loss."""
    keys = sorted(
        {k for g in groups for k in g["niah"]},
        key=lambda k: (k.split("@")[0], int(k.split("@")[1])),
    )
    lines = [
        "| configuration | arch | seeds | "
        + " | ".join(k.replace("niah_single_", "S-NIAH-") for k in keys)
        + " | MQAR acc | held-out loss |",
        "|---|---|---:|" + "---:|" * (len(keys) + 2),
    ]
    for g in groups:
        lines.append(
            f"| {g['name']} | {g['arch']} | {g['seeds']} | "
            + " | ".join(fmt_spread(g["niah"].get(k)) for k in keys)
            + f" | {fmt_spread(g['mqar'], '.3f')} | "
            f"{fmt_spread(g['heldout_loss'], '.3f')} |"
        )
    return "\n".join(lines)


def seeds_length_table(groups: list[dict]) -> str:
    """Rows: configurations trained with several seeds; columns: NIAH lengths, all tasks of a
    length together: right/n = share [pooled 95% Wilson interval] (the seeds' own shares
    min-max; the 95% t interval of their mean, the seed as the unit)."""
    lengths = sorted({int(k) for g in groups for k in g.get("niah_by_length", {})})
    lines = [
        "| configuration | arch | seeds | " + " | ".join(f"NIAH@{n}" for n in lengths) + " |",
        "|---|---|---:|" + "---|" * len(lengths),
    ]
    for g in groups:
        cells = []
        for length in lengths:
            c = g.get("niah_by_length", {}).get(str(length))
            if c is None:
                cells.append("-")
                continue
            p, t = c["pooled"], c.get("seed_interval")
            seeds = f"seeds {c['min']:.0f}-{c['max']:.0f}"
            if t is not None:  # a share: the interval within [0, 100]
                seeds += f"; t {max(t[0], 0):.0f}-{min(t[1], 100):.0f}"
            cells.append(
                f"{p['right']}/{p['n']} = {100 * p['right'] / p['n']:.0f}% "
                f"[{p['lo']:.0f}, {p['hi']:.0f}] ({seeds})"
            )
        lines.append(f"| {g['name']} | {g['arch']} | {g['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_name(workdir: storage.PathLike) -> str:
    """A run's name in tables: its folder, with the parent for a seed run (``hwh/seed1``)."""
    workdir = storage.path(workdir)
    seed = workdir.name.startswith("seed") and workdir.name[4:].isdigit()
    return f"{workdir.parent.name}/{workdir.name}" if seed else workdir.name


def seed_dirs(folder: storage.PathLike) -> list:
    """The seed workdirs (``seed<N>``, by N) of a folder ``launch.experiment --seeds`` made."""
    dirs = [p for p in storage.path(folder).glob("seed*") if p.is_dir() and p.name[4:].isdigit()]
    return sorted(dirs, key=lambda p: int(p.name[4:]))


def _steady(rows: list[dict]) -> tuple[list[float], list[float]]:
    """tokens/s and MFU of the perf rows after the first (whose window includes compilation)."""
    perf = [r for r in rows if r["split"] == "perf"]
    steady = perf[1:] or perf
    return [r["tokens_per_s"] for r in steady], [r["mfu"] for r in steady if "mfu" in r]


def _fmt(x, spec=".2f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def niah_table(exps: list[dict]) -> str:
    """Rows: experiments; columns: task x length (score 0-100, mean over depths; with the 95%
    Wilson interval of the share right and n where the results have them)."""
    keys = sorted(
        {k for e in exps for k in e["niah"]}, key=lambda k: (k.split("@")[0], int(k.split("@")[1]))
    )
    head = (
        "| model | arch | " + " | ".join(k.replace("niah_single_", "S-NIAH-") for k in keys) + " |"
    )
    lines = [head, "|---|---|" + "---:|" * len(keys)]
    for e in exps:
        iv = e.get("niah_intervals", {})
        lines.append(
            f"| {e['name']} | {e['arch']} | "
            + " | ".join(
                stats.fmt_share(iv[k]) if k in iv else _fmt(e["niah"].get(k), ".0f") for k in keys
            )
            + " |"
        )
    return "\n".join(lines)


def run_table(exps: list[dict]) -> str:
    """Params, tokens, held-out loss, MQAR accuracy and throughput per experiment."""
    lines = [
        "| model | arch | params | tokens | held-out loss | MQAR acc (mean) | retrieval "
        "probe: answer / chance acc | tokens/s | MFU | wall |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in exps:
        mq = statistics.mean(e["mqar"].values()) if e["mqar"] else None
        rp = e.get("retrieval")
        probe = f"{rp['answer_accuracy']:.3f} / {rp['needle_accuracy']:.3f}" if rp else "-"
        if rt := e.get("retrieval_trained"):  # a model taught another wording: that one too
            probe += (
                f"; its {rt['format']} wording "
                f"{rt['answer_accuracy']:.3f} / {rt['needle_accuracy']:.3f}"
            )
        lines.append(
            f"| {e['name']} | {e['arch']} | {e['params'] / 1e6:.1f}M | {e['tokens'] / 1e6:.1f}M | "
            f"{_fmt(e['heldout_loss'], '.3f')} | {_fmt(mq, '.3f')} | {probe} | "
            f"{_fmt(e['tokens_per_s'], ',.0f')} | {_fmt(e['mfu'], '.1%')} | "
            f"{e['wall_s']:.0f} s |"
        )
    return "\n".join(lines)


def training_row(workdir: storage.PathLike, last: int = 50) -> dict:
    """What a run's metrics.jsonl says, finished or not: steps reached, mean train loss of the
    last ``last`` logged steps, the last held-out loss, median steady tokens/s; and the
    micro-batch split of its memory_plan.json (rows x micro-batches a step)."""
    workdir = storage.path(workdir)
    path = workdir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{workdir} has no metrics.jsonl: not a launch.train workdir")
    rows = read_metrics(path)
    train = {r["step"]: r["loss"] for r in rows if r["split"] == "train"}
    if not train:
        raise ValueError(f"{path} has no training steps")
    held = [r["loss"] for r in rows if r["split"] == "heldout"]
    tps, _ = _steady(rows)
    tail = sorted(train)[-last:]
    plan = workdir / "memory_plan.json"  # the micro-batch split the step ran with
    plan = json.loads(plan.read_text()) if plan.exists() else {}
    return {
        "name": run_name(workdir),
        "split": f"{plan['micro_batch']} x {plan['grad_accum']}" if plan else "-",
        "steps": max(train),
        "train_loss_tail": statistics.mean(train[s] for s in tail),
        "tail": len(tail),
        "heldout_loss": held[-1] if held else None,
        "tokens_per_s": statistics.median(tps) if tps else None,
        "train": train,
    }


def _eval_state(exp: dict | None) -> str:
    if exp is None:
        return "no (cut short)"
    return "yes" if exp["eval_finished"] else "partial (cut during it)"


def loss_figure(rows: list[dict], path: storage.PathLike, smooth: int = 25):
    """Training loss (running mean over ``smooth`` steps) of several runs against step."""
    import numpy as np

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        steps = sorted(r["train"])
        n = min(smooth, len(steps))  # a short run: the mean of all its steps
        loss = np.convolve([r["train"][s] for s in steps], np.ones(n) / n, "valid")
        ax.plot(steps[n - 1 :], loss, label=r["name"], lw=1.2, marker="." if n < smooth else None)
    ax.set_title(f"training loss (running mean of {smooth} steps)")
    finish_line_chart(fig, ax, path, xlabel="step", ylabel="loss (nats/token)")


def depth_table(named_rows: dict[str, list[dict]]) -> str:
    """NIAH by needle depth: a row per (configuration, length), a column per depth, each cell
    the prompts answered right of those asked (every task, and every seed of a configuration,
    together; a prompt counts right at score 100)."""
    depths = sorted({r["depth"] for rows in named_rows.values() for r in rows})
    lines = [
        "| configuration | length | " + " | ".join(f"depth {d}%" for d in depths) + " |",
        "|---|---:|" + "---:|" * len(depths),
    ]
    for name, rows in named_rows.items():
        for length in sorted({r["length"] for r in rows}):
            cells = []
            for d in depths:
                at = [r for r in rows if r["length"] == length and r["depth"] == d]
                right = sum(r["score"] >= 100 for r in at)
                cells.append(f"{right}/{len(at)}" if at else "-")
            lines.append(f"| {name} | {length} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def depth_figure(named_rows: dict[str, list[dict]], path: storage.PathLike):
    """NIAH share right by needle depth, one line per configuration, at its longest length
    (every task and seed together), with 95% Wilson intervals."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rows in named_rows.items():
        if not rows:
            continue
        length = max(r["length"] for r in rows)
        depths = sorted({r["depth"] for r in rows})
        cells = [
            stats.share([r["score"] for r in rows if r["length"] == length and r["depth"] == d])
            for d in depths
        ]
        mid = [100 * c["right"] / c["n"] for c in cells]
        err = [[m - c["lo"] for m, c in zip(mid, cells)], [c["hi"] - m for m, c in zip(mid, cells)]]
        ax.errorbar(depths, mid, yerr=err, marker="o", capsize=3, label=f"{name} ({length:,})")
    ax.set_ylim(-3, 103)
    ax.set_title("NIAH by needle depth at each configuration's longest length")
    finish_line_chart(fig, ax, path, xlabel="needle depth (% of the context)", ylabel="right (%)")


def commonsense_table(named_rows: dict[str, list[dict]]) -> str:
    """Zero-shot accuracy per task and configuration: the mean over its runs (seeds) with the
    runs' range and the 95% t interval of the mean (the seed as the unit; every seed is asked the
    same items, so the items are not pooled), beside a uniform guess's accuracy on those items.
    ``named_rows``: configuration -> each run's ``results["commonsense"]``."""
    tasks = [
        t for t in commonsense.TASKS if any(t in r for rows in named_rows.values() for r in rows)
    ]
    lines = [
        "| task | metric | examples | chance | " + " | ".join(named_rows) + " |",
        "|---|---|---:|---:|" + "---|" * len(named_rows),
    ]
    for task in tasks:
        n = {r[task]["examples"] for rows in named_rows.values() for r in rows if task in r}
        if len(n) > 1:
            raise ValueError(f"commonsense {task}: runs scored different examples {sorted(n)}")
        n = n.pop()
        guess = commonsense.chance(task, limit=n)
        for metric in ("acc", "acc_norm"):
            cells = []
            for rows in named_rows.values():
                vals = [100 * r[task][metric] for r in rows if metric in r.get(task, {})]
                if not vals:
                    cells.append("-")
                    continue
                ci = stats.seeds_interval(vals)
                cells.append(
                    f"{statistics.mean(vals):.1f} ({min(vals):.1f}-{max(vals):.1f}"
                    + (f"; t {ci[0]:.1f}-{ci[1]:.1f})" if ci else ")")
                )
            if all(c == "-" for c in cells):
                continue
            chance_s = "-" if guess is None else f"{100 * guess:.1f}"
            lines.append(f"| {task} | {metric} | {n} | {chance_s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(workdirs: list[storage.PathLike], out_dir: storage.PathLike) -> str:
    """Write report.md (tables), experiments.json and the cross-model figures into out_dir.

    Runs without their closing evaluation (cut short) are not dropped: they get their own table
    (steps reached, training and held-out loss) and appear in the loss figure; a run cut during
    its evaluation shows the cells it measured ("-" for the others) and is marked "partial"."""
    out_dir = storage.path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = {}  # a folder of seed runs: its runs, and their row over seeds
    expanded = []
    for w in workdirs:
        seeds = seed_dirs(w) if not (storage.path(w) / "summary.json").exists() else []
        if seeds:
            groups[storage.path(w).name] = seeds
        expanded += seeds or [w]
    workdirs = expanded
    finished = [
        w
        for w in workdirs
        if (storage.path(w) / "eval" / "results.json").exists()
        and (storage.path(w) / "summary.json").exists()
    ]
    cut = [w for w in workdirs if w not in finished]
    exps = [summarize(w) for w in finished]
    by_dir = dict(zip(finished, exps))
    rows = [training_row(w) for w in workdirs]
    lens = {e["train_len"] for e in exps}
    if len(lens) > 1:
        raise ValueError(
            f"experiments trained at different lengths {sorted(lens)}: report them separately"
        )
    text = ""
    if exps:
        params = [e["params"] for e in exps]
        spread = (max(params) - min(params)) / min(params)
        text += (
            f"Training length L = {lens.pop()}; parameter spread {spread:.1%} "
            f"(max vs min).\n\nNIAH (RULER single 1/2/3, string match, % over depths):\n\n"
            f"{niah_table(exps)}\n\nRuns:\n\n{run_table(exps)}\n"
        )
    over = []
    for name, dirs in groups.items():
        done = [by_dir[d] for d in dirs if d in by_dir]
        if done:
            over.append({"name": name, **over_seeds(done)})
    if over:
        text += (
            "\nOver seeds (NIAH score: mean +- sd over seeds (min-max) [95% interval of "
            "the share right, prompts of all seeds pooled] n prompts):\n\n"
            f"{seeds_table(over)}\n\nAll tasks of a length together (prompts right over "
            f"the seeds [95% Wilson interval] (each seed's own share, min-max; the 95% t "
            f"interval of their mean, the seed as the unit)):\n\n"
            f"{seeds_length_table(over)}\n"
        )
    by_config, sense = {}, {}  # a seed folder's runs together, a single run alone
    for w, e in by_dir.items():
        name = next((g for g, dirs in groups.items() if w in dirs), e["name"])
        by_config.setdefault(name, []).extend(e["results"].get("niah", []))
        if "commonsense" in e["results"]:
            sense.setdefault(name, []).append(e["results"]["commonsense"])
    if any(by_config.values()):
        depth_figure(by_config, out_dir / "niah_by_depth.png")
        text += (
            "\nNIAH by needle depth (prompts right of those asked, every task and seed of a "
            f"configuration together):\n\n{depth_table(by_config)}\n"
        )
    if sense:
        text += (
            "\nZero-shot commonsense, % (mean over runs (range; 95% t interval, the seed as the "
            f"unit)):\n\n{commonsense_table(sense)}\n"
        )
    text += (
        "\nTraining (every run; loss = mean of the last logged steps):\n\n"
        + "| run | steps | micro-batches | train loss | held-out loss | median tokens/s | "
        "closing evaluation |\n"
        "|---|---:|---|---:|---:|---:|---|\n"
        + "".join(
            f"| {r['name']} | {r['steps']} | {r['split']} | {r['train_loss_tail']:.4f} "
            f"(last {r['tail']}) | "
            f"{_fmt(r['heldout_loss'], '.4f')} | {_fmt(r['tokens_per_s'], ',.0f')} | "
            f"{_eval_state(by_dir.get(w))} |\n"
            for w, r in zip(workdirs, rows)
        )
    )
    (out_dir / "report.md").write_text(text)
    if over:
        (out_dir / "seeds.json").write_text(json.dumps(over, indent=2))
    (out_dir / "experiments.json").write_text(
        json.dumps(
            [{k: v for k, v in e.items() if k != "results"} for e in exps]
            + [
                {k: v for k, v in r.items() if k != "train"} | {"closing_eval": False}
                for w, r in zip(workdirs, rows)
                if w in cut
            ],
            indent=2,
        )
    )
    if exps:  # each run under its own name: two runs' results may carry one model name
        compare([{**e["results"], "model": e["name"]} for e in exps], out_dir)
    loss_figure(rows, out_dir / "train_loss.png")
    return text
