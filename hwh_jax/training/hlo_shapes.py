"""Arrays named in XLA's HLO text: their dtypes, shapes and bytes. Read by
``sharding.collectives`` (what a compiled step sends) and ``profile.hlo_bytes`` (what a kernel
moves)."""
from __future__ import annotations

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
