"""lm-evaluation-harness's own command line finds this project's model: ``lm_eval --model hwh
--model_args checkpoint=RUN --tasks ...``.

lm-eval looks models up in its registry only, which its own ``lm_eval.models`` fills; it has no
plugin or entry-point discovery. The package therefore installs one start-up line into
site-packages (``hwh_jax_lm_eval.pth``, written by ``setup.py`` for plain and editable installs)
that calls ``install``: a finder that waits for ``lm_eval.models`` to be imported and then
registers "hwh" under lm-eval's lazy form, the name ``launch.lm_eval:RunLM``. Nothing of the
project is imported until lm-eval asks for "hwh"; a Python that never imports lm-eval pays for
importing this module only, which imports nothing but ``sys``.
``python -m launch.lm_eval`` registers the same class itself and needs none of this.
"""

import sys

NAME = "hwh"
TARGET = "launch.lm_eval:RunLM"  # lm-eval's "module:object" placeholder, imported on first use
WATCHED = "lm_eval.models"  # the module whose import fills lm-eval's model registry


def register() -> None:
    """Register ``NAME`` -> ``TARGET`` in lm-eval's model registry (a no-op if it is there)."""
    from lm_eval.api.registry import model_registry

    try:
        model_registry.register(NAME, target=TARGET)
    except ValueError as e:  # another package took the name: say so, never break lm-eval
        import warnings

        warnings.warn(f"lm-eval's model {NAME!r} is not this project's: {e}", stacklevel=2)


class _AfterImport:
    """A finder (``sys.meta_path``): finds ``WATCHED`` as the other finders do, and registers
    once it has run. Imports nothing until then."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != WATCHED:
            return None
        import importlib.util

        sys.meta_path.remove(self)  # once, and not while the others look for it
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            register()

        spec.loader.exec_module = exec_module  # this spec's own loader object
        return spec


def install() -> None:
    """Register "hwh" when lm-eval's models are imported (now, if they already are)."""
    if WATCHED in sys.modules:
        register()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
