"""Linear-head kinds by name: the linear heads a layer puts beside its FA heads
(``ModelConfig.la_kind``). Each kind is one module of this folder that calls ``register`` with
a ``HeadKind``: how to build its heads from the model config, their training FLOPs, and the
options they take. The mixer, the FLOPs count, the decode-cache tables and the configs ask
``get`` and ``names``; nothing else lists the kinds.

The heads module a kind builds answers five calls (``LinearHeads`` below): its input
projections, their heads (for sharding), the mixing over a sequence, and the decode cache and
its update. Its parameters say their own roles: each names its axes (``dense(..., names)``,
``variables.partitioned``) for sharding, and weight decay applies to every parameter of two or
more dimensions except those named in ``HeadKind.no_decay``.

Adding a kind is one new module here (``lightning.py`` is the one to copy) plus, if it needs
one, its kernel op in ``kernels_pallas``; docs/architecture.md walks through it. A kind kept
outside the package registers the same way from any importable module named in the
environment variable ``HWH_HEAD_KINDS`` (comma-separated), imported when the kinds are first
asked for.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
from typing import Any, Callable, Protocol

PLUGINS_ENV = "HWH_HEAD_KINDS"


class LinearHeads(Protocol):
    """What the mixer asks of a kind's heads (shapes: B batch, T tokens, n heads, V value dim)."""

    num_heads: int

    def projections(self) -> tuple:
        """The input projections (``linear.dense``), in the order ``mix`` takes their outputs."""

    def projection_heads(self) -> list:
        """Heads in each projection's output (None: not split by head), for sharding."""

    def mix(self, *proj, segment_ids=None, positions=None):
        """The heads' outputs [B, T, n*V] from the projections' outputs [B, T, width]; a new
        document (``segment_ids`` changes) starts from an empty state."""

    def init_cache(self, batch: int, dtype) -> dict:
        """The decode cache of ``batch`` rows: arrays whose size does not grow with context."""

    def extend(self, proj, valid, cache, *, t0=0, start=None):
        """(outputs [B, Tn, n*V], cache) after tokens t0 .. t0+Tn-1; ``valid`` [B, Tn] False
        at left padding, which must leave the cache as it was."""


@dataclasses.dataclass(frozen=True)
class HeadKind:
    """One kind of linear heads.

    ``build(cfg, num_heads, layer, dtype, param_dtype, rngs)`` returns the heads of one layer
    (a ``LinearHeads``); ``flops(cfg)`` is their training FLOPs per token and head (forward
    and backward, the chunked form's mixing only: the projections are counted from the
    parameters, hwh_jax/training/flops.py)."""

    name: str
    build: Callable[..., Any]
    flops: Callable[[Any], float]  # of a ModelConfig (layers/config.py, which imports this)
    about: str = ""  # one line: the recurrence, for tables and errors
    conv_optional: bool = False  # model.la_short_conv adds a short convolution on q, k, v
    uses_key_dim: bool = True  # False: model.la_key_dim is unused (an element-wise state)
    no_decay: tuple[str, ...] = ()  # parameter names that take no weight decay
    torch_form: bool = False  # hwh_jax/hf/modeling/modeling_hwh.py has these heads (HF export)
    # the settings of a kernel op of the kind's own (a frozen dataclass like GDNSettings, with
    # ``platform`` and ``interpret``, ``chunk_size`` if it is chunked): set from a run config as
    # model.<name>.<setting>, kept in ModelConfig.kind_settings, read by the heads through
    # ``cfg.kind_settings_for(name)``. None: the kind's op takes a ModelConfig field's settings
    settings: type | None = None


_KINDS: dict[str, HeadKind] = {}
_loaded = False


def register(kind: HeadKind) -> HeadKind:
    """Add ``kind`` under its name; a second kind of one name is an error."""
    old = _KINDS.get(kind.name)
    if old is not None and old is not kind:
        raise ValueError(f"linear-head kind {kind.name!r} is registered twice ({old.about!r})")
    _KINDS[kind.name] = kind
    return kind


def _plugins() -> list[str]:
    """The modules $HWH_HEAD_KINDS names now, each imported (a no-op once it is)."""
    names = [s.strip() for s in os.environ.get(PLUGINS_ENV, "").split(",") if s.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ImportError(f"{PLUGINS_ENV} names {name!r}, which cannot be imported: {e}") from e
    return names


def _load() -> None:
    """Import every module of this package and those named in $HWH_HEAD_KINDS, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    _plugins()


def own_settings() -> dict[str, type]:
    """{kind: its settings class} for the kinds that carry kernel settings of their own."""
    return {n: _KINDS[n].settings for n in names() if _KINDS[n].settings is not None}


def configured_settings() -> dict[str, type]:
    """``own_settings`` of the kinds a run config has a section for: this package's and those
    of the modules named in $HWH_HEAD_KINDS now (imported if not yet), so that a config's keys
    do not depend on what else a process happened to import. A kind belongs to the module its
    ``build`` is defined in."""
    _load()
    named = _plugins()
    return {
        n: cls
        for n, cls in own_settings().items()
        if _KINDS[n].build.__module__.startswith(__name__ + ".")
        or _KINDS[n].build.__module__ in named
    }


def names() -> tuple[str, ...]:
    """Every registered kind, the package's in the order of ``ORDER`` first."""
    _load()
    known = [k for k in ORDER if k in _KINDS]
    return tuple(known + sorted(k for k in _KINDS if k not in ORDER))


def get(name: str) -> HeadKind:
    """The kind called ``name``; an unknown name is an error that lists the known ones."""
    _load()
    if name not in _KINDS:
        raise ValueError(
            f"model.la_kind={name!r} is not a linear-head kind; known: {list(names())} "
            f"(a kind is a module of hwh_jax/layers/heads/, or one named in ${PLUGINS_ENV})"
        )
    return _KINDS[name]


# the order of the tables: the two delta-rule kinds, then the decaying-state kinds as the zoo
# paper lists them, then HGRN
ORDER = ("gdn", "deltanet", "lightning", "retnet", "mamba2", "gla", "hgrn", "hgrn2")
