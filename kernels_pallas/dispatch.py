"""How the kernel entry points pick an implementation, and how a user sees what they picked.

Each op keeps a table {backend: preferred impl}; ``impl="auto"`` looks the backend up there.
The choice is logged once per (op, impl, backend) and remembered in ``chosen()``.
"""
from __future__ import annotations

import logging

import jax

_log = logging.getLogger("kernels_pallas")
_chosen: dict[str, str] = {}


def backend() -> str:
    """'cpu', 'gpu' or 'tpu' (the default backend of this process)."""
    return jax.default_backend()


def record(op: str, impl: str) -> str:
    """Remember and log (once) which implementation `op` runs on this backend."""
    key = f"{op}@{backend()}"
    if _chosen.get(key) != impl:
        _chosen[key] = impl
        _log.info("kernels_pallas: %s runs impl=%r on backend %r", op, impl, backend())
    return impl


def chosen() -> dict[str, str]:
    """{'op@backend': impl} for every op called so far in this process."""
    return dict(_chosen)


def check_impl(op: str, impl: str, allowed: tuple[str, ...]) -> None:
    if impl not in allowed:
        raise ValueError(f"{op}: impl={impl!r} is not one of {allowed}")
