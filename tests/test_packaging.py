"""The distribution installs one import package, ``agentlang`` (``runtime/`` and ``kernels/``
install as ``agentlang.runtime`` and ``agentlang.kernels``): a wheel built from a copy of the
sources lists nothing else in its RECORD, and carries every module of the three folders, the dashboard's files and the native C sources."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"agentlang": "agentlang", "runtime": "agentlang/runtime", "kernels": "agentlang/kernels"}


@pytest.fixture(scope="module")
def wheel_record(tmp_path_factory) -> list[str]:
    src = tmp_path_factory.mktemp("src")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = out.glob("agentlang-*.whl")
    with zipfile.ZipFile(whl) as z:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        return [row[0] for row in csv.reader(io.StringIO(z.read(record).decode()))]


def test_the_wheel_installs_no_top_level_package_but_agentlang(wheel_record):
    top = {p.split("/")[0] for p in wheel_record if not p.split("/")[0].endswith(".dist-info")}
    assert top == {"agentlang"}, top


def test_the_wheel_carries_every_module_and_the_dashboard_files(wheel_record):
    have = set(wheel_record)
    for folder, installed in FOLDERS.items():
        for f in (ROOT / folder).rglob("*.py"):
            rel = f.relative_to(ROOT / folder).as_posix()
            if "__pycache__" in rel:
                continue
            assert f"{installed}/{rel}" in have, f"{folder}/{rel} is not in the wheel"
    for f in (ROOT / "runtime" / "server" / "static").iterdir():
        assert f"agentlang/runtime/server/static/{f.name}" in have, f.name
    native = ROOT / "runtime" / "quant" / "native"
    sources = list(native.rglob("*.[ch]"))
    assert {f.parent.name for f in sources} == {"native", "avx512", "avx2"}
    for f in sources:
        rel = f.relative_to(native).as_posix()
        assert f"agentlang/runtime/quant/native/{rel}" in have, rel


def test_the_package_names_resolve_to_the_repository_folders():
    import agentlang.kernels
    import agentlang.runtime

    assert Path(agentlang.runtime.__file__).parent == ROOT / "runtime"
    assert Path(agentlang.kernels.__file__).parent == ROOT / "kernels"
