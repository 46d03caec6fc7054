"""Packages: the distribution installs one top-level import package, ``agentlang``.

The repository keeps ``runtime/`` and ``kernels/`` at its top level; they install as
``agentlang.runtime`` and ``agentlang.kernels`` (an editable install maps them the same way,
so pytest from the repository root and ``python bench/X.py`` import the same modules).
Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

MAPPED = {"agentlang.runtime": "runtime", "agentlang.kernels": "kernels"}


def packages() -> list[str]:
    found = find_packages(include=["agentlang", "agentlang.*"])
    for name, folder in MAPPED.items():
        found += [name] + [f"{name}.{p}" for p in find_packages(folder)]
    return found


setup(packages=packages(), package_dir=MAPPED)
