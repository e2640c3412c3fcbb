"""Reading XLA's HLO text: the arrays an instruction names (dtypes, shapes, bytes), which
``profile.hlo_bytes`` uses for what a kernel moves, and ``collectives``: what a compiled step
sends between devices, read from the module's computations (each collective once, loops'
trip counts applied)."""

from __future__ import annotations

import collections
import dataclasses
import math
import re

DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "bf16": 2,
    "f16": 2,
    "s16": 2,
    "u16": 2,
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "f64": 8,
    "s64": 8,
    "u64": 8,
}
_ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")


def arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, shape) of each array in an HLO type, e.g. "(bf16[8,64]{1,0}, f32[])"."""
    return [
        (dtype, tuple(int(d) for d in dims.split(",") if d))
        for dtype, dims in _ARRAY.findall(type_text)
    ]


def nbytes(type_text: str) -> int:
    """The bytes of the arrays in an HLO type (a dtype not in ``DTYPE_BYTES`` counts 4)."""
    return sum(DTYPE_BYTES.get(dtype, 4) * math.prod(shape) for dtype, shape in arrays(type_text))


KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) (all-gather|all-reduce|reduce-scatter|"
    r"all-to-all|collective-permute)(-start)?\((.*)$"
)
_DONE = re.compile(
    r"= (.*?) (?:all-gather|all-reduce|reduce-scatter|all-to-all|"
    r"collective-permute)-done\(%([\w.\-]+)"
)
_HEADER = re.compile(r"^(ENTRY )?%([\w.\-]+) .*\{\s*$")
_CALLS = re.compile(
    r"\b(calls|body|condition|to_apply|true_computation|false_computation)="
    r"%([\w.\-]+)"
)
_CALL_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}")
_LIST_GROUPS = re.compile(r"replica_groups=\{\{([0-9, ]*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a compiled program: what its result holds on one device, how many
    devices take part, and how often one run of the program executes it."""

    op: str  # one of KINDS
    shapes: tuple  # the result's array shapes (several for a combined collective)
    bytes: int  # the result's bytes on one device: the whole array of an
    #                          all-gather or all-reduce, the shard of a reduce-scatter
    source: str  # the jax operation it came from (HLO metadata op_name)
    group: int = 0  # devices in each replica group (0: not stated in the text)
    times: int = 1  # executions per run of the program (loop trip counts multiplied)

    @property
    def wire_bytes(self) -> float:
        """Bytes one device sends for one execution under a ring algorithm: an all-gather or
        all-to-all (g-1)/g of its result, a reduce-scatter (g-1) shards, an all-reduce twice
        (g-1)/g (a reduce-scatter then an all-gather), a permute its result."""
        g = self.group
        if self.op == "collective-permute":
            return float(self.bytes)
        if g <= 1:
            return 0.0 if g == 1 else float(self.bytes)
        share = {
            "all-gather": (g - 1) / g,
            "all-to-all": (g - 1) / g,
            "reduce-scatter": float(g - 1),
            "all-reduce": 2 * (g - 1) / g,
        }[self.op]
        return self.bytes * share


def _group_size(line: str) -> int:
    if m := _MESH_GROUPS.search(line):
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", m.group(1)))
        return math.prod(int(sizes[a]) for a in re.findall(r"'([^']+)'", m.group(2)))
    if m := _LIST_GROUPS.search(line):
        return len([d for d in m.group(1).split(",") if d.strip()])
    if m := _IOTA_GROUPS.search(line):
        return int(m.group(2))
    return 0


def _loop_trips(line: str, comps: dict) -> int:
    """A while loop's trip count: the compiler's ``known_trip_count``, else the bound of a
    condition ``counter < constant`` (JAX's loops count from 0), else 1."""
    if m := _TRIPS.search(line):
        return int(m.group(1))
    cond = re.search(r"condition=%([\w.\-]+)", line)
    lines = comps.get(cond.group(1), []) if cond else []
    constants = dict(re.findall(r"%([\w.\-]+) = s32\[\][^ ]* constant\((\d+)\)", "\n".join(lines)))
    for line in lines:
        if line.lstrip().startswith("ROOT") and "direction=LT" in line:
            m = re.search(r"compare\(%[\w.\-]+, %([\w.\-]+)\)", line)
            if m and m.group(1) in constants:
                return int(constants[m.group(1)])
    return 1


def _multiplicities(comps: dict, entry: str | None) -> dict:
    """How often one run of the program executes each computation: the entry once, a while
    loop's body its trip count, a fusion or call as often as its caller."""
    callers = collections.defaultdict(list)
    for name, lines in comps.items():
        for line in lines:
            trips = _loop_trips(line, comps) if " while(" in line else 1
            for kind, callee in _CALLS.findall(line):
                factor = trips if kind == "body" else 1
                callers[callee].append((name, factor))
            for group in _CALL_LISTS.findall(line):
                for callee in re.findall(r"%([\w.\-]+)", group):
                    callers[callee].append((name, 1))
    memo = {}

    def mult(name, seen=()):
        if name not in memo:
            if name == entry:
                memo[name] = 1
            elif name in seen:  # a cycle: not an HLO module; count it once
                return 1
            else:
                memo[name] = sum(mult(c, seen + (name,)) * f for c, f in callers.get(name, ()))
        return memo[name]

    return {name: (mult(name) if entry else 1) for name in comps}


def collectives(hlo_text: str) -> list[Collective]:
    """The collectives of a compiled program (``jitted.lower(...).compile().as_text()``), each
    counted once however the compiler wrote it, with how often a run executes it.

    Compiled TPU programs split one collective into an asynchronous start, continuation
    fusions overlapped with compute and a done, each a fusion holding an instruction of the
    same ``channel_id``, kind and shape: those count once (channel ids are not unique in
    general: a ``shard_map``'s collectives may all carry 1, so outside fusions each instruction
    counts). TPU writes a reduce-scatter as an all-reduce
    inside a fusion named ``all-reduce-scatter``: read as a reduce-scatter of the fusion's
    shard. ``-start``/``-done`` pairs count once, with the done's result. Collectives inside a
    while loop count its known trip count (``times``); those in computations nothing calls
    are left out."""
    comps, entry, current = collections.defaultdict(list), None, "<top>"
    for line in hlo_text.splitlines():
        if h := _HEADER.match(line):
            current = h.group(2)
            entry = current if h.group(1) else entry
            continue
        comps[current].append(line)
    if "<top>" in comps and entry:
        del comps["<top>"]
    times = _multiplicities(comps, entry)
    fused = {
        callee
        for lines in comps.values()
        for line in lines
        if " fusion(" in line
        for callee in re.findall(r"calls=%([\w.\-]+)", line)
    }
    done_types = {
        m.group(2): m.group(1)
        for lines in comps.values()
        for line in lines
        if (m := _DONE.search(line))
    }
    found: dict = {}
    for comp, lines in comps.items():
        if not times[comp]:
            continue
        for line in lines:
            m = _COLLECTIVE.match(line)
            if not m:
                continue
            name, type_text, op, start, _ = m.groups()
            channel = re.search(r"channel_id=(\d+)", line)
            key = (
                (op, channel.group(1), tuple(arrays(type_text)))
                if channel and comp in fused
                else (comp, name)
            )
            if key in found:
                found[key] = dataclasses.replace(
                    found[key], times=max(found[key].times, times[comp])
                )
                continue
            if start and name in done_types:
                type_text = done_types[name]
            group = _group_size(line)
            n = nbytes(type_text)
            shapes = tuple(shape for _, shape in arrays(type_text))
            if op == "all-reduce" and comp.startswith("all-reduce-scatter") and group:
                op, n = "reduce-scatter", n // group
            src = re.search(r'op_name="([^"]*)"', line)
            found[key] = Collective(op, shapes, n, src.group(1) if src else "", group, times[comp])
    return list(found.values())


def summary(found: list[Collective]) -> dict:
    """Per kind, per run of the program: executions, result bytes and ring wire bytes."""
    out = {}
    for c in found:
        k = out.setdefault(c.op, {"count": 0, "bytes": 0, "wire_bytes": 0.0})
        k["count"] += c.times
        k["bytes"] += c.bytes * c.times
        k["wire_bytes"] += c.wire_bytes * c.times
    return out
