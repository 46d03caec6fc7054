"""SGLang's metadata routes on the real server: the fields SGLang 0.5.23's server returns and
its frontend / router read, with values that agree with the engine."""

from __future__ import annotations

from pathlib import Path

SGLANG_MODEL_INFO = ("model_path", "served_model_name", "tokenizer_path", "is_generation",
                     "preferred_sampling_params", "weight_version", "load_format",
                     "reasoning_parser", "tool_call_parser", "disaggregation_mode",
                     "has_image_understanding", "has_audio_understanding", "model_type",
                     "architectures")


def test_model_info_and_alias(http):
    info = http.get("/model_info").json()
    assert set(SGLANG_MODEL_INFO) <= set(info)
    assert info == http.get("/get_model_info").json()
    assert info["served_model_name"] == "SmolLM2-135M-Instruct"
    assert (Path(info["model_path"]) / "config.json").is_file()
    assert (Path(info["tokenizer_path"]) / "tokenizer.json").is_file()
    assert info["is_generation"] is True
    assert info["model_type"] == "llama" and info["architectures"] == ["LlamaForCausalLM"]


def test_server_info_and_alias(http):
    info = http.get("/server_info").json()
    model = http.get("/model_info").json()
    assert info == http.get("/get_server_info").json()
    assert info["model_path"] == model["model_path"]
    assert info["served_model_name"] == model["served_model_name"]
    assert info["context_length"] == model["max_context"] == 8192
    assert info["max_total_num_tokens"] == model["kv_pool"]["capacity_tokens"]
    assert info["max_req_input_len"] == model["max_tokens_per_sequence"] - 1
    assert info["page_size"] == model["page_size"]
    assert info["tp_size"] == info["dp_size"] == 1
    assert info["internal_states"][0]["max_total_num_tokens"] == info["max_total_num_tokens"]
    assert isinstance(info["version"], str)


def test_health_generate_and_flush_methods(http):
    r = http.get("/health_generate")
    assert r.status_code == 200 and r.content == b""
    assert http.get("/flush_cache").status_code == 200
    assert http.post("/flush_cache").status_code == 200
