"""Every use of JAX's private modules (``jax._src``) in the project, each with the versions it
was written against and what callers get where it is missing. Nothing else imports
``jax._src`` (``tests/project/test_architecture.py`` holds that); a JAX upgrade that moves one of these
breaks here, in one file, and its fallback keeps the caller running.

  cudnn_attention()       JAX's cuDNN attention module, whose fwd/bwd rules the sequence axis'
                          attention calls block by block (``attention/shard_rows.py``: JAX 0.10
                          and 0.11; that module checks their signatures); None: not there.
  mosaic_gpu_interpret()  the Mosaic GPU interpreter's parameters (public as
                          ``plgpu.InterpretParams`` where a JAX has it; private in 0.10 and
                          0.11); None: no interpreter.
  coordination_client()   ``jax.distributed``'s coordination-service client, which the peer
                          watchdog polls (``launch/peers.py``; no public accessor in 0.10 or
                          0.11); None: not started or not there.
  triton_lowering()       Pallas' Triton lowering module, which ``bench/triton_regs.py`` hooks
                          to read the Triton IR; None: not there.
  jaxlib_version()        jaxlib's version as a tuple of ints (public ``jaxlib.version``).
"""

from __future__ import annotations

import functools


@functools.cache
def cudnn_attention():
    try:
        from jax._src.cudnn import fused_attention_stablehlo
    except ImportError:
        return None
    return fused_attention_stablehlo


def mosaic_gpu_interpret():
    from jax.experimental.pallas import mosaic_gpu as plgpu

    params = getattr(plgpu, "InterpretParams", None)
    if params is not None:
        return params()
    try:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
    except ImportError:
        return None
    return InterpretGPUParams()


def coordination_client():
    try:
        from jax._src import distributed
    except ImportError:
        return None
    state = getattr(distributed, "global_state", None)
    return getattr(state, "client", None)


def triton_lowering():
    try:
        from jax._src.pallas.triton import lowering
    except ImportError:
        return None
    return lowering


def jaxlib_version() -> tuple[int, ...]:
    import jaxlib.version

    return tuple(int(x) for x in jaxlib.version.__version__.split(".")[:3] if x.isdigit())
