"""Shared fixtures of the KV cache tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench():
    """``bench/kv_quant.py`` as a module (its teacher-forced agreement and perplexity)."""
    path = Path(__file__).parents[2] / "bench" / "kv_quant.py"
    spec = importlib.util.spec_from_file_location("kv_quant_bench", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
