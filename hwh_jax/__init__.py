"""hwh-jax: head-wise hybrid (NoPE full attention + Gated DeltaNet) language models in JAX.

Packages, lowest first (each imports only those below it; ``docs/architecture.md``):
``kernels_pallas`` (ops) <- ``layers`` <- ``models`` <- ``inference``, ``analysis``, ``data``,
``profiling`` <- ``eval`` <- ``training`` <- ``launch``.
"""

__version__ = "0.1.0"
