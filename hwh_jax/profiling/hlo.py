"""Reading XLA's HLO text: the arrays an instruction names (dtypes, shapes, bytes), which
``profile.hlo_bytes`` uses for what a kernel moves, and ``collectives``: what a compiled step
sends between devices."""
from __future__ import annotations

import dataclasses
import math
import re

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
               "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")


def arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, shape) of each array in an HLO type, e.g. "(bf16[8,64]{1,0}, f32[])"."""
    return [(dtype, tuple(int(d) for d in dims.split(",") if d))
            for dtype, dims in _ARRAY.findall(type_text)]


def nbytes(type_text: str) -> int:
    """The bytes of the arrays in an HLO type (a dtype not in ``DTYPE_BYTES`` counts 4)."""
    return sum(DTYPE_BYTES.get(dtype, 4) * math.prod(shape) for dtype, shape in arrays(type_text))


_COLLECTIVE = re.compile(r"= (.*?) (all-gather|all-reduce|reduce-scatter|all-to-all|"
                         r"collective-permute)(?:-start)?\(")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a compiled program and the bytes its result holds on one device."""
    op: str                  # all-gather, all-reduce, reduce-scatter, all-to-all, ...
    shapes: tuple            # the result's array shapes (several for a combined collective)
    bytes: int               # the result's bytes on one device
    source: str              # the jax operation it came from (HLO metadata op_name)


def collectives(hlo_text: str) -> list[Collective]:
    """The collectives of a compiled program (``jitted.lower(...).compile().as_text()``)."""
    out = []
    for line in hlo_text.splitlines():
        m = _COLLECTIVE.search(line)
        if not m:
            continue
        shapes = tuple(shape for _, shape in arrays(m.group(1)))
        src = re.search(r'op_name="([^"]*)"', line)
        out.append(Collective(m.group(2), shapes, nbytes(m.group(1)),
                              src.group(1) if src else ""))
    return out
