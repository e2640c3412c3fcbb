"""How a kernel op picks its implementation, and how a user sees what it picked.

Each op takes its choices as one frozen settings value, a ``KernelSettings`` subclass (as JAX's
own Pallas ops take a ``BlockSizes``):

  impl       "auto" or one of the op's implementations (``IMPLS``);
  interpret  run the op's Pallas kernel in an interpreter (True, or ``pltpu.InterpretParams()``
             for TPU semantics) where it has no compiled lowering, e.g. on a CPU;
  platform   the platform the program is compiled for, "cpu" | "gpu" | "tpu"; None: this
             process's default backend. Naming it lets one host lower a program for another
             (``jax.export`` for TPU from a CPU);

plus the op's own launch settings. ``impl="auto"`` looks the platform up in the op's ``AUTO``
table (``FALLBACK`` where it has no entry); the op may fall back further when a shape does not
suit its kernel. Every choice is logged once and kept in ``chosen()``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, ClassVar

import jax

_log = logging.getLogger("kernels_pallas")
_chosen: dict[str, str] = {}
PLATFORMS = ("cpu", "gpu", "tpu")


@dataclasses.dataclass(frozen=True)
class KernelSettings:
    """The choices every kernel op takes; subclasses add their launch settings and set ``OP``,
    ``IMPLS``, ``AUTO`` and ``FALLBACK``. Invalid values raise ``ValueError`` when built."""

    impl: str = "auto"
    interpret: Any = False
    platform: str | None = None

    OP: ClassVar[str] = "kernel"
    IMPLS: ClassVar[tuple[str, ...]] = ("auto", "reference")
    AUTO: ClassVar[dict[str, str]] = {}
    FALLBACK: ClassVar[str] = "reference"

    def __post_init__(self):
        if self.impl not in self.IMPLS:
            raise ValueError(f"{self.OP}: impl={self.impl!r} is not one of {self.IMPLS}")
        if self.platform is not None and self.platform not in PLATFORMS:
            raise ValueError(
                f"{self.OP}: platform={self.platform!r} is not one of "
                f"{PLATFORMS} (or None: the default backend)"
            )

    def require_positive(self, *names: str, optional: tuple[str, ...] = ()):
        """Refuses, naming the field, any of ``names`` below 1, and any of ``optional`` below 1
        unless None (its default: chosen from the shape)."""
        for name in names + optional:
            value = getattr(self, name)
            if name in optional and value is None:
                continue
            if value < 1:
                alt = " or None" if name in optional else ""
                raise ValueError(f"{self.OP}: {name} must be >= 1{alt}, got {value}")

    def target(self) -> str:
        """The platform the op is compiled for."""
        return self.platform or jax.default_backend()

    def choose(self) -> str:
        """``impl``, or for "auto" the target platform's entry of ``AUTO``."""
        return self.AUTO.get(self.target(), self.FALLBACK) if self.impl == "auto" else self.impl

    def replace(self, **changes) -> "KernelSettings":
        return dataclasses.replace(self, **changes)


def triton_target(settings: KernelSettings) -> bool:
    """Whether a kernel written for Triton alone can run as ``settings`` say: compiled for a GPU,
    or in the generic interpreter (``interpret=True``)."""
    return settings.target() == "gpu" or settings.interpret is True


_XLA_IMPLS = ("reference", "recurrent", "scan", "chunk_reference")


def lowering(settings: KernelSettings, impl: str) -> str:
    """What compiles ``impl`` where ``settings`` target: XLA for the jnp forms, the named
    library, else (a Pallas kernel) Triton on a GPU, Mosaic on a TPU, the interpreter."""
    if impl in _XLA_IMPLS:
        return "XLA"
    if impl == "cudnn":
        return "cuDNN"
    if impl == "splash":
        return "JAX's splash attention, a Pallas kernel compiled by Mosaic TPU"
    if settings.interpret is not False:
        return "a Pallas kernel in the interpreter" + (
            " (TPU semantics)" if settings.interpret is not True else ""
        )
    if impl == "mosaic":
        return "a Pallas kernel compiled by Mosaic GPU"
    return {
        "gpu": "a Pallas kernel compiled by Triton",
        "tpu": "a Pallas kernel compiled by Mosaic TPU",
    }.get(settings.target(), "a Pallas kernel (no compiled lowering here)")


def record(settings: KernelSettings, impl: str, op: str | None = None) -> str:
    """Remember and log (once) which implementation ``op`` (default ``settings.OP``) runs on
    its platform, and what compiles it there (``lowering``)."""
    op = settings.OP if op is None else op
    key = f"{op}@{settings.target()}"
    if _chosen.get(key) != impl:
        _chosen[key] = impl
        _log.info(
            "kernels_pallas: %s runs impl=%r on %r: %s",
            op,
            impl,
            settings.target(),
            lowering(settings, impl),
        )
    return impl


def chosen() -> dict[str, str]:
    """{'op@platform': impl} for every op called so far in this process."""
    return dict(_chosen)


def pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
