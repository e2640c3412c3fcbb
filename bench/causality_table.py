r"""What the committed rows of ``bench/causality.py`` have checked: for every size and model, how
many of the (stage, batch, length) points have bit-exact forward paths and how each point's
gradient came out, best row first; ``--missing`` lists the points no row checks and those
whose gradient is still inconclusive (what is left to run).

  python bench/causality_table.py measurements/benchmark_rows/*/causality*.jsonl --missing

A point is (stage init/trained, B 1/8, T 2,048/8,192): eight a model. ``forward`` counts the
points where one row holds the plain forward, the training forward and prefill all bit-exact
before p. The gradient is checked at every point of the small size and at batch 1 of the larger
ones (the script's own rule); a point's gradient is, from best to worst:
- ``identical``: nothing moved (every leaf bit-identical);
- ``embedding``: deterministic ops, and the largest move (against the rounding floor, 2^-12 of a
  leaf's largest entry) is the embedding table's, within the floor: a scatter-add whose
  summation order follows the token ids;
- ``tolerance``: otherwise within the script's tolerance (each leaf within its rerun level or
  the floor);
- ``inconclusive``: default GPU ops, forward paths bit-exact, and a leaf moved more than its own
  reruns did (``--deterministic`` decides it);
- NOT CAUSAL: any other failing row. It is listed whatever other rows of the point say.
"""

from __future__ import annotations

import argparse
import collections
import json

from causality import ARCHS, DETERMINISTIC, KINDS, SIZES, arch_list

POINTS = [(s, b, t) for s in ("init", "trained") for b in (1, 8) for t in (2048, 8192)]
FWD = ("plain", "train_fwd", "prefill")
GRADES = ("identical", "embedding", "tolerance", "inconclusive")


def grad_grade(row: dict) -> str:
    g = row["grad"]
    deterministic = DETERMINISTIC in row.get("xla_flags", "")
    if g["before_p"] == 0:
        return "identical"
    if g["causal"]:
        embedding = "embed" in g["worst_leaf"] and (deterministic or g["rerun"] == 0)
        return "embedding" if embedding else "tolerance"
    forward_exact = all(row[k]["before_p"] == 0 for k in FWD if k in row)
    return "inconclusive" if not deterministic and forward_exact else "NOT CAUSAL"


def table(rows: list[dict]) -> list[dict]:
    """One entry a (size, model), the script's matrix first and then any other model the rows
    hold: forward points, gradient grades, what is missing and what is not causal."""
    seen = collections.defaultdict(lambda: {"fwd": set(), "grad": {}, "bad": []})
    for r in rows:
        if "model" not in r:
            continue  # the kernels alone
        e = seen[(r["size"], r["model"])]
        point = (r["stage"], r["B"], r["T"])
        if all(k in r for k in FWD):
            if all(r[k]["before_p"] == 0 for k in FWD):
                e["fwd"].add(point)
            elif any(not r[k]["causal"] for k in FWD):
                e["bad"].append(f"forward {point}")
        if "grad" in r and "leaf_rerun" in r["grad"]:  # older rows lack each leaf's rerun level
            grade = grad_grade(r)
            old = e["grad"].get(point)
            if grade == "NOT CAUSAL":
                e["bad"].append(f"gradient {point}")
            elif old is None or GRADES.index(grade) < GRADES.index(old):
                e["grad"][point] = grade
    matrix = [(size, m[0]) for size in SIZES for m in arch_list(ARCHS, KINDS)]
    out = []
    for size, model in matrix + [k for k in seen if k not in matrix]:
        e = seen[(size, model)]
        need = [p for p in POINTS if size == "small" or p[1] == 1]
        grades = collections.Counter(e["grad"][p] for p in need if p in e["grad"])
        missing = [f"forward {p}" for p in POINTS if p not in e["fwd"]]
        missing += [f"gradient {p}" for p in need if p not in e["grad"]]
        undecided = [f"gradient {p} inconclusive" for p in need if e["grad"].get(p) == GRADES[-1]]
        out.append(
            {
                "size": size,
                "model": model,
                "forward": len(e["fwd"]),
                "grad_points": len(need),
                **{g: grades[g] for g in GRADES},
                "missing": missing,
                "undecided": undecided,
                "not_causal": e["bad"],
            }
        )
    return out


def markdown(entries: list[dict]) -> str:
    lines = [
        "| size | model | forward bit-exact | gradient: identical / embedding / tolerance / "
        "inconclusive | not checked |",
        "|---|---|---:|---|---:|",
    ]
    for e in entries:
        grads = " / ".join(str(e[g]) for g in GRADES)
        bad = f" **NOT CAUSAL: {', '.join(e['not_causal'])}**" if e["not_causal"] else ""
        lines.append(
            f"| {e['size']} | {e['model']} | {e['forward']}/{len(POINTS)} | {grads} of {e['grad_points']}"
            f"{bad} | {len(e['missing'])} |"
        )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+", help="JSON-lines files written by bench/causality.py")
    ap.add_argument(
        "--missing",
        action="store_true",
        help="list every point not checked, and every gradient still inconclusive",
    )
    args = ap.parse_args()
    rows = [json.loads(line) for f in args.rows for line in open(f) if line.strip()]
    entries = table(rows)
    print(markdown(entries))
    if args.missing:
        for e in entries:
            if e["missing"] + e["undecided"]:
                print(f"{e['size']} {e['model']}: {'; '.join(e['missing'] + e['undecided'])}")


if __name__ == "__main__":
    main()
