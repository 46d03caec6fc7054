"""The prepared GPU script's CPU dry run (toy sizes, Triton interpreted, CUDA graphs stood in
for by ``RerunCapture``) runs every section end to end and writes its JSON where OUT points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_engine_dry_run(tmp_path, model_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_engine.py"), "--tokenizer",
                           str(model_path), "--dry-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_engine.json").read_text())
    check = result["check"]["float32 triton vs torch"]
    assert check["identical"] == check["of"] == 2
    r = result["llama8b"]
    assert [(c["batch"], c["context"]) for c in r["decode"]] == [(1, 64), (3, 64), (5, 32)]
    assert all(c["graph_ms"] > 0 and c["floor_ms"] > 0 for c in r["decode"])
    g = r["graph_vs_eager"]                        # the asserted check: own model and graphs
    assert g["ok"] and g["disabled"] is None and g["buckets"] == [1, 4]
    assert [(x["identical"], x["of"]) for x in g["runs"]] == [(1, 1), (3, 3)]
    assert r["graph_vs_eager_bf16"]["buckets"] == [1, 4, 8]   # decode cells' buckets too
    sp = r["shared_prefix"]
    assert sp["output_tokens"] == 4 * 4 and sp["cache_hit_rate"] > 0.5
    assert "CUDA-graph == eager greedy tokens: yes" in proc.stdout


def test_extend_winner_verdict(tmp_path):
    from bench.extend_winner import main, verdict

    dflt, tma = {"block_m": 64, "tma": False}, {"block_m": 64, "tma": True}
    data = {"chosen": {"extend": {"d128": tma, "d64": dflt}},
            "sweep": [{"kind": "extend", "heads": "d128", "config": dflt},
                      {"kind": "extend", "heads": "d128", "config": tma},
                      {"kind": "extend", "heads": "d64", "config": dflt}],
            "extend": [{"heads": "d128", "prefix": 0, "ratio_graph": 1.2},
                       {"heads": "d128", "prefix": 0, "ratio_graph": 1.35},
                       {"heads": "d128", "prefix": 2048, "ratio_graph": 3.0},
                       {"heads": "d64", "prefix": 0, "ratio_graph": 1.1}]}
    v = verdict(data)
    assert v["d128"] == {"winner": tma, "is_default": False, "prefill_ratio_graph": 1.35,
                         "meets_target": False}
    assert v["d64"]["is_default"] and v["d64"]["meets_target"]
    (tmp_path / "kernels.json").write_text(json.dumps(data))
    assert main([str(tmp_path)]) == 0
    assert json.loads((tmp_path / "extend_winner.json").read_text()) == v
