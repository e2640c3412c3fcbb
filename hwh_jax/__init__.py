"""hwh-jax: head-wise hybrid (NoPE full attention + Gated DeltaNet) language models in JAX.

Its packages and the order in which they may import each other are pyproject.toml's
import-linter contract, the one list of them (``docs/architecture.md`` draws it).
"""

__version__ = "0.1.0"
