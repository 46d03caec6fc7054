"""KV capacity planner: the worked figures (Llama-3-8B/70B-class), parameter counts, capacity
arithmetic, the embedded model from its safetensors headers, and the ``kv-plan`` CLI."""

from __future__ import annotations

import json
import math

import pytest

from agentlang.cli import main
from agentlang.runtime.models.kv_plan import GIB, count_parameters, max_concurrent_requests, plan, plan_for_model

LLAMA3_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256,
             "torch_dtype": "bfloat16"}
LLAMA3_70B = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
              "hidden_size": 8192, "intermediate_size": 28672, "vocab_size": 128256,
              "torch_dtype": "bfloat16"}


def test_llama3_8b_fp16_is_128_kib_per_token():
    p = plan(LLAMA3_8B, context=8192, memory_gb=80, kv_dtype="float16")
    assert p.bytes_per_token == 128 * 1024
    assert (p.num_layers, p.num_kv_heads, p.head_dim) == (32, 8, 128)
    # "auto" = the model dtype: bf16, the same 2 bytes
    assert plan(LLAMA3_8B, context=8192, memory_gb=80).bytes_per_token == 128 * 1024
    assert p.num_parameters == 8_030_261_248                 # the published 8.03B
    assert p.weights_bytes == 2 * 8_030_261_248
    assert p.bytes_per_request == 8192 * 128 * 1024 == 1 * GIB
    assert p.max_concurrent_requests == (80 * GIB - p.weights_bytes) // GIB == 65


def test_llama3_70b_32k_request_is_10_gib():
    p = plan(LLAMA3_70B, context=32768, memory_gb=320)
    assert p.bytes_per_token == 320 * 1024
    assert p.bytes_per_request == 10 * GIB
    assert p.num_parameters == 70_553_706_496                # the published 70.6B
    assert p.max_concurrent_requests == (320 * GIB - p.weights_bytes) // (10 * GIB) == 18
    # weights alone exceed 80 GiB: no request fits
    assert plan(LLAMA3_70B, context=32768, memory_gb=80).max_concurrent_requests == 0


def test_int8_halves_the_kv_and_doubles_the_requests():
    fp16 = plan(LLAMA3_8B, context=32768, memory_gb=80, kv_dtype="float16")
    int8 = plan(LLAMA3_8B, context=32768, memory_gb=80, kv_dtype="int8")
    assert int8.bytes_per_token == 32 * 2 * 8 * (128 + 2)    # + fp16 scale per token and head
    assert int8.bytes_per_token / fp16.bytes_per_token == pytest.approx(130 / 256)
    assert int8.kv_dtype == "int8" and int8.model_dtype == "bfloat16"
    assert fp16.max_concurrent_requests == 16 and int8.max_concurrent_requests == 32


def test_pages_round_requests_up():
    # 100 tokens at page 16 hold 7 pages = 112 token slots
    p = plan(LLAMA3_8B, context=100, memory_gb=80, kv_dtype="float16", page_size=16)
    assert p.bytes_per_request == 112 * 128 * 1024
    assert max_concurrent_requests(10 * 112 * 1024, 1024, 100, 16) == 10
    assert max_concurrent_requests(10 * 112 * 1024 - 1, 1024, 100, 16) == 9


def test_tied_embeddings_count_once():
    tied = dict(LLAMA3_8B, tie_word_embeddings=True)
    assert count_parameters(LLAMA3_8B) - count_parameters(tied) == 128256 * 4096


@pytest.mark.parametrize("kwargs,field", [({"context": 0}, "context"),
                                          ({"memory_gb": -1}, "memory_gb"),
                                          ({"kv_dtype": "int4"}, "kv_dtype"),
                                          ({"page_size": 0}, "page_size")])
def test_bad_arguments(kwargs, field):
    args = {"context": 1024, "memory_gb": 80, **kwargs}
    with pytest.raises(ValueError, match=field):
        plan(LLAMA3_8B, **args)


def test_embedded_model_from_its_files():
    p = plan_for_model("default", context=4096, memory_gb=2, kv_dtype="int8")
    assert p.model == "SmolLM2-135M-Instruct"
    assert p.num_parameters == 134_515_008                   # safetensors headers (tied head)
    assert p.model_dtype == "float32" and p.weights_bytes == 4 * 134_515_008
    assert p.bytes_per_token == 30 * 2 * 3 * (64 + 2)
    assert p.max_concurrent_requests == (2 * GIB - p.weights_bytes) // (256 * 16 * 11880)


def test_cli_kv_plan(capsys):
    assert main(["kv-plan", "--model", "default", "--context", "4096", "--memory-gb", "2",
                 "--kv-dtype", "int8", "--page-size", "16"]) == 0
    out = capsys.readouterr().out
    assert "11,880 bytes" in out and "int8" in out and "33 requests of 4,096 tokens" in out
    assert main(["kv-plan", "--model", "/no/such/model"]) == 2
    assert "model path does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["kv-plan", "--kv-dtype", "int4"])


def test_directory_with_only_a_config_is_planned_from_the_architecture(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    p = plan_for_model(str(tmp_path), context=8192, memory_gb=24, weights="q4_1")
    params = count_parameters(LLAMA3_8B)
    assert p.num_parameters == params and p.weights_format == "q4_1"
    assert p.weights_bytes == math.ceil(params * 20 / 32)          # 20 bytes per 32 weights
    bf16 = plan_for_model(str(tmp_path), context=8192, memory_gb=24, weights="bf16")
    assert bf16.weights_bytes == 2 * params
    assert p.max_concurrent_requests > bf16.max_concurrent_requests
    assert main(["kv-plan", "--model", str(tmp_path), "--weights", "q8_0", "--context", "8192",
                 "--memory-gb", "24"]) == 0
    assert "q8_0" in capsys.readouterr().out
    with pytest.raises(ValueError, match="weights must be one of"):
        plan(LLAMA3_8B, context=10, memory_gb=1, weights="q3")


def test_gguf_file_weights_are_its_tensor_bytes():
    from agentlang.runtime.weights.model_loader import resolve_model

    gguf = resolve_model("default", "auto").path
    p = plan_for_model(str(gguf), context=4096, memory_gb=2, kv_dtype="int8")
    assert p.weights_format == "gguf"
    assert 0.9 * gguf.stat().st_size < p.weights_bytes < gguf.stat().st_size
    assert p.num_parameters == 134_515_008
