"""The package list, found rather than written by hand (pyproject.toml holds everything else).

The repository root is the package `deepserve` (pyproject: `package-dir = {"deepserve" = "."}`),
so its subpackages are the directories below the root: `core`, `actors.je`, ... Setuptools'
`packages.find` names what it finds relative to where it searches, which would make them
top-level packages `core`, `actors`, ...; this file puts `deepserve.` in front. Namespace
packages count (PEP 420: `actors/flowserve/master` has no `__init__.py`; `configs/*` hold data),
so a new directory ships without a change here. Dotted directories (.venv, .git, *.egg-info)
are never packages; what else a checkout holds besides the code is excluded by name.
"""

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

# Not code: the tests, the docs, and what a working checkout makes (mypyc's build, run logs).
NOT_PACKAGES = ("tests", "docs", "build", "runs", "dist")
EXCLUDE = [pattern for name in NOT_PACKAGES for pattern in (name, f"{name}.*")] + ["*__pycache__"]


class BuildPy(build_py):
    """This file sits in the root package's directory: it builds the package, it is not part of it."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        found = super().find_package_modules(package, package_dir)
        return [m for m in found if (m[0], m[1]) != ("deepserve", "setup")]


setup(
    packages=["deepserve", *(f"deepserve.{p}" for p in find_namespace_packages(".", exclude=EXCLUDE))],
    cmdclass={"build_py": BuildPy},
)
