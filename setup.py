"""Build hook: ship the top-level migrations/ and manifests/ inside the wheel.

They live at the repository root (DESIGN's layout); an installed orchestrator (a wheel, a
container image) finds them as orchestrator/_data/{migrations,manifests}. Everything else is in
pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("migrations", "manifests")


class BuildPyWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads them from the checkout
        for name in SHIPPED:
            shutil.copytree(ROOT / name, Path(self.build_lib) / "orchestrator" / "_data" / name,
                            dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithData})
