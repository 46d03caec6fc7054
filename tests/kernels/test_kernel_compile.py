"""The kernels compile for real GPUs (sm_90 H100/H200, sm_80 A100) on this GPU-less machine:
Triton's compiler and bundled ptxas run in a subprocess without the interpreter, as
``bench/kernel_compile.py`` does. Catches what the interpreter accepts but the compiler rejects,
register spills, and a TMA or wgmma path that silently fell back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import dataclasses, json, sys
from bench.kernel_compile import report
rows = report(int(sys.argv[1]), quiet=True)
print(json.dumps([[label, {**{k: v for k, v in dataclasses.asdict(c).items() if k != "ttgir"},
                          "programs_per_sm": c.programs_per_sm(int(sys.argv[1]))}]
                  for label, c in rows]))
"""


def compile_report(arch: int) -> list[tuple[str, dict]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # the compiler's default, stated (silences a warning)
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(arch)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return [tuple(r) for r in json.loads(res.stdout.strip().splitlines()[-1])]


@pytest.mark.slow
@pytest.mark.parametrize("arch", [90, 80])
def test_kernels_compile_for_gpus(arch):
    rows = compile_report(arch)
    kernels = {r["kernel"] for _, r in rows}
    assert kernels == {"_decode_stage1", "_decode_stage2", "_extend_kernel", "_store_kv_kernel",
                       "_copy_pages_kernel"}
    assert len(rows) == (20 if arch >= 90 else 16)  # TMA launches on Hopper only
    assert [label for label, r in rows if r["local_bytes"]] == []  # no register spills
    # registers and shared memory of each program fit an SM (else the launch fails on the GPU)
    assert [label for label, r in rows if r["programs_per_sm"] < 1] == []
    extend = {label: r for label, r in rows if label.startswith("extend")}
    for label, r in extend.items():
        # every dot on tensor cores: Hopper's wgmma on sm_90, mma on sm_80
        assert (r["wgmma_dots"] if arch == 90 else r["mma_dots"]) > 0, label
        if "tma" in label:
            assert r["tma_loads"] > 0, label
            if "prefix  0" in label:  # plain prefill from k_new/v_new: no gathered load left
                assert r["cp_async_loads"] == 0, label
        else:  # gathered or contiguous, the K/V loads are software-pipelined (cp.async)
            assert r["tma_loads"] == 0 and r["cp_async_loads"] > 0, label
