"""What pyproject.toml cannot say: the package installs one start-up line, ``hwh_jax_lm_eval.pth``,
into site-packages, by which lm-eval's own ``lm_eval`` command finds the model "hwh"
(``_hwh_lm_eval_hook.py`` says why and what it does). A plain install carries it in the wheel
(``build_py``); an editable install in the editable wheel's root, beside setuptools' own
start-up files (``editable_wheel``)."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "hwh_jax_lm_eval.pth"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH)


class BuildPy(build_py):
    def run(self):
        super().run()
        self.copy_file(SOURCE, os.path.join(self.build_lib, PTH), preserve_mode=False)


class EditableWheel(editable_wheel):
    def _install_namespaces(self, installation_dir, pth_prefix):
        # the one step of setuptools' editable wheel that writes into the wheel's root
        super()._install_namespaces(installation_dir, pth_prefix)
        self.copy_file(SOURCE, os.path.join(installation_dir, PTH), preserve_mode=False)


setup(cmdclass={"build_py": BuildPy, "editable_wheel": EditableWheel})
