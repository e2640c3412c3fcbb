"""The package picture of docs/architecture.md, drawn from the code's imports.

  python tools/architecture.py            # print the Mermaid block
  python tools/architecture.py --write    # replace it in docs/architecture.md
  python tools/architecture.py --check    # exit 1 if docs/architecture.md is out of date

Nodes are the packages of the import-linter layers contract in pyproject.toml (one row per
layer, top to bottom); an arrow A --> B says A imports B (drawn only where B is not already
reached through another arrow from A: the transitive reduction). The import graph is grimp's,
the library import-linter checks the contract with.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- architecture:begin -->", "<!-- architecture:end -->"


def layers() -> list[list[str]]:
    """The layers contract's rows, top first, each a list of package names."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers")
    return [[name.strip() for name in row.split("|")] for row in contract["layers"]]


def package_edges(packages: list[str]) -> set[tuple[str, str]]:
    """(A, B) for every package A that imports a module of package B directly."""
    roots = sorted({p.split(".")[0] for p in packages})
    graph = grimp.build_graph(*roots, cache_dir=None)

    def owner(module: str) -> str | None:
        best = None
        for p in packages:
            if module == p or module.startswith(p + "."):
                best = p if best is None or len(p) > len(best) else best
        return best

    edges = set()
    for module in graph.modules:
        a = owner(module)
        for imported in graph.find_modules_directly_imported_by(module):
            b = owner(imported)
            if a and b and a != b:
                edges.add((a, b))
    return edges


def reduce(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Drop A -> C where A reaches C through other edges."""
    out = {a: {b for x, b in edges if x == a} for a, _ in edges}

    def reach(a, skip):
        seen, todo = set(), [b for b in out.get(a, ()) if (a, b) != skip]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(out.get(n, ()))
        return seen

    return {(a, b) for a, b in edges if b not in reach(a, (a, b))}


def mermaid() -> str:
    rows = layers()
    packages = [p for row in rows for p in row]
    node = {p: p.replace(".", "_") for p in packages}
    lines = ["```mermaid", "flowchart TB"]
    for i, row in enumerate(rows):
        lines.append(f'  subgraph L{i}[" "]')
        lines.extend(f'    {node[p]}["{p}"]' for p in row)
        lines.append("  end")
    for a, b in sorted(reduce(package_edges(packages))):
        lines.append(f"  {node[a]} --> {node[b]}")
    lines.append("```")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    block = f"{BEGIN}\n{mermaid()}\n{END}"
    if not (args.write or args.check):
        print(block)
        return 0
    text = DOC.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    if args.check:
        if text[start:stop] != block:
            print(
                f"{DOC} is out of date: run python tools/architecture.py --write", file=sys.stderr
            )
            return 1
        return 0
    DOC.write_text(text[:start] + block + text[stop:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
