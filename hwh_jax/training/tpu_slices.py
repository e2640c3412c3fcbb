"""TPU slices by name, their chips' datasheet figures, and compile-only devices for them.

A slice is named as Cloud TPU names it (``v5p-32``, ``v5e-16``, ``v6e-256``, ``v4-8``: for v4
and v5p the number counts TensorCores, two a chip; for v5e and v6e it counts chips) or by its
chip grid (``v5p:2x2x4``, ``v5e:4x4``). ``compile_only_devices(slice)`` asks the TPU compiler
(the ``libtpu`` package, ``pip install "hwh-jax[tpu-plan]"``) for devices of that topology
that programs can be compiled for on any host, a CPU one included
(``jax.experimental.topologies``); nothing runs on them.

Chip figures (Cloud TPU's system-architecture pages): peak dense bf16 FLOP/s, HBM capacity and
bandwidth, and the bidirectional inter-chip interconnect (ICI) bandwidth of one chip.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU chip's datasheet figures."""

    generation: str
    libtpu_name: str  # the topology prefix libtpu takes ("v5" for v5p)
    bf16_flops: float  # peak dense bf16 FLOP/s
    hbm_bytes: int
    hbm_bytes_per_s: float
    ici_bytes_per_s: float  # bidirectional, all links of the chip
    dims: int  # 3: a 3-D torus (v4, v5p), 2: a 2-D one (v5e, v6e)
    cores_per_chip: int  # TensorCores the accelerator-type name counts


GiB = 2**30
CHIPS = {
    "v4": Chip("v4", "v4", 275e12, 32 * GiB, 1228e9, 600e9, 3, 2),
    "v5e": Chip("v5e", "v5e", 197e12, 16 * GiB, 819e9, 400e9, 2, 1),
    "v5p": Chip("v5p", "v5", 459e12, 95 * GiB, 2765e9, 1200e9, 3, 2),
    "v6e": Chip("v6e", "v6e", 918e12, 32 * GiB, 1638e9, 800e9, 2, 1),
}
# the chip grids Cloud TPU gives the common slice sizes (chips -> grid)
GRIDS_3D = {
    4: (2, 2, 1),
    8: (2, 2, 2),
    16: (2, 2, 4),
    32: (2, 4, 4),
    64: (4, 4, 4),
    128: (4, 4, 8),
    256: (4, 8, 8),
    512: (8, 8, 8),
    1024: (8, 8, 16),
}
GRIDS_2D = {
    1: (1, 1),
    4: (2, 2),
    8: (2, 4),
    16: (4, 4),
    32: (4, 8),
    64: (8, 8),
    128: (8, 16),
    256: (16, 16),
}


class MissingLibtpu(ValueError):
    """The TPU compiler (libtpu) is not installed."""


@dataclasses.dataclass(frozen=True)
class Slice:
    """A TPU slice: its chip and its chip grid."""

    name: str
    chip: Chip
    grid: tuple[int, ...]

    @property
    def chips(self) -> int:
        return math.prod(self.grid)

    @property
    def topology_name(self) -> str:
        return f"{self.chip.libtpu_name}:{'x'.join(map(str, self.grid))}"

    @property
    def wrap(self) -> tuple[bool, bool, bool]:
        """Torus wrap-around per dimension, as Cloud TPU builds the slice: a 3-D slice wraps
        once every side is 4 or more (a full cube), a 2-D one along a side of 16."""
        if self.chip.dims == 3:
            full = all(d >= 4 for d in self.grid)
            return (full, full, full)
        return tuple(d == 16 for d in self.grid) + (False,)


def parse(name: str) -> Slice:
    """A ``Slice`` of ``v5p-32`` or ``v5p:2x2x4`` (module docstring); ValueError naming the
    forms and sizes known."""
    text = name.strip().lower()
    m = re.fullmatch(r"(v4|v5e|v5p|v6e)-(\d+)", text)
    if m:
        chip = CHIPS[m.group(1)]
        count = int(m.group(2))
        chips, rest = divmod(count, chip.cores_per_chip)
        grids = GRIDS_3D if chip.dims == 3 else GRIDS_2D
        if rest or chips not in grids:
            known = ", ".join(f"{chip.generation}-{c * chip.cores_per_chip}" for c in grids)
            raise ValueError(
                f"--topology={name}: not a {chip.generation} slice size this "
                f"knows ({known}); give its chip grid instead, e.g. "
                f"{chip.generation}:{'x'.join(['2'] * chip.dims)}"
            )
        return Slice(text, chip, grids[chips])
    m = re.fullmatch(r"(v4|v5e|v5p|v6e):(\d+(?:x\d+)+)", text)
    if m:
        chip = CHIPS[m.group(1)]
        grid = tuple(int(d) for d in m.group(2).split("x"))
        if len(grid) != chip.dims or min(grid) < 1:
            raise ValueError(
                f"--topology={name}: a {chip.generation} grid has {chip.dims} sides, each >= 1"
            )
        return Slice(text, chip, grid)
    raise ValueError(
        f"--topology={name}: expected a Cloud TPU name (v5p-32, v5e-16, v6e-256, "
        f"v4-8) or a chip grid (v5p:2x2x4, v5e:4x4, v6e:16x16, v4:2x2x1)"
    )


def check_libtpu() -> None:
    if importlib.util.find_spec("libtpu") is None:
        raise MissingLibtpu(
            "compiling for a TPU topology needs the TPU compiler, which is not "
            'installed: pip install "hwh-jax[tpu-plan]"  (libtpu)'
        )


def compile_only_devices(s: Slice) -> list:
    """Devices of slice ``s`` that JAX compiles for on this host (module docstring)."""
    check_libtpu()
    from jax.experimental import topologies

    per_host = (2, 2, 1) if s.chips >= 4 else (*s.grid, 1)[:3]
    topo = topologies.get_topology_desc(
        topology_name=s.topology_name,
        platform="tpu",
        chip_config_name="megacore" if s.chip.cores_per_chip == 2 else "default",
        chips_per_host_bounds=tuple(per_host),
        num_slices=1,
        wrap=s.wrap,
    )
    return list(topo.devices)
