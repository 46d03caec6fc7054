"""Shared fixtures: the embedded model (HF reference and tokenizer), a greedy oracle, and a tiny
random-weight Llama directory (2 layers, the embedded tokenizer)."""

from __future__ import annotations

import functools
import os

# The Triton kernels run on CPU only under the interpreter, which triton picks when a
# ``@triton.jit`` function is defined: set before any test module imports ``agentlang.kernels``
# (tests/kernels/ is collected after other folders that import it). Only triton reads it.
os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woodcutter and his three children. Every morning he",
    "Q: What is the boiling point of water at sea level in Celsius?\nA:",
    "List three primary colors:\n1.",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "import numpy as np\n\ndef softmax(x):",
    "In 1969, the Apollo 11 mission",
]


@pytest.fixture(scope="session")
def model_path():
    from agentlang.runtime.weights.model_loader import resolve_model

    return resolve_model().path


@pytest.fixture(scope="session")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@pytest.fixture(scope="session")
def hf_model(model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()


class GreedyOracle:
    """HF transformers greedy continuations (cached) and the tie rule for comparisons."""

    def __init__(self, hf_model, tokenizer):
        self.hf = hf_model
        self.tok = tokenizer

    @functools.lru_cache(maxsize=None)
    def continuation(self, prompt_ids: tuple[int, ...], n: int) -> tuple[int, ...]:
        with torch.no_grad():
            out = self.hf.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)
        return tuple(out[0, len(prompt_ids):].tolist())

    def top2_gap(self, ids: list[int]) -> float:
        with torch.no_grad():
            logits = self.hf(torch.tensor([ids])).logits[0, -1]
        top = torch.topk(logits, 2).values
        return float(top[0] - top[1])

    def assert_same(self, prompt_ids: list[int], ours: list[int], ref: list[int], label: str = ""):
        """Token-identical, or the first difference is a true tie (top-2 within 1e-4)."""
        n = min(len(ours), len(ref))
        for i in range(n):
            if ours[i] != ref[i]:
                gap = self.top2_gap(list(prompt_ids) + list(ref[:i]))
                print(f"[tie check] {label}: first difference at token {i}: ours {ours[i]} "
                      f"ref {ref[i]}, reference top-2 gap {gap:.2e}")
                assert gap <= 1e-4, (
                    f"{label}: outputs diverge at token {i} (ours {ours[i]}, ref {ref[i]}) and the "
                    f"reference's top-2 gap {gap:.2e} is not a tie")
                return
        assert len(ours) == len(ref), f"{label}: length {len(ours)} != {len(ref)}"


@pytest.fixture(scope="session")
def oracle(hf_model, tokenizer):
    return GreedyOracle(hf_model, tokenizer)


@pytest.fixture(scope="session")
def prompt_ids(tokenizer):
    return [tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    from tests.support.models import random_llama
    from agentlang.runtime.weights.model_loader import resolve_model

    return random_llama(
        resolve_model().path, tmp_path_factory.mktemp("tiny_llama"), hidden_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=128, max_position_embeddings=512, tie_word_embeddings=False,
    )


@pytest.fixture(scope="session")
def tokenizer_fields():
    """The GGUF metadata of a tiny byte-level BPE tokenizer (tests.support.gguf_files)."""
    from tests.support.gguf_files import gguf_tokenizer_fields

    return gguf_tokenizer_fields()


def _native_builds() -> list:
    from agentlang.runtime.quant.native import runnable_isas

    return list(runnable_isas()) or [None]


@pytest.fixture(scope="session", params=_native_builds(), ids=lambda i: i.name if i else "none")
def native_lib(request):
    """Each build of the native library this CPU runs (avx512 and avx2 on an AVX-512 machine,
    avx2 alone on an AVX2 one), skipped where none does: the torch kernels are used there."""
    from agentlang.runtime.quant.native import build_library, unavailable_reason

    if request.param is None:
        pytest.skip(f"no native build runs on this CPU ({unavailable_reason()})")
    return build_library(request.param)
