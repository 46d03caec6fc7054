"""Our Llama implementation over the paged pool against HF transformers (fp32, CPU)."""

import pytest
import torch

from agentlang.runtime.attention.torch_backend import TorchAttentionBackend
from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.models.llama import LlamaModel
from agentlang.runtime.cache.page_allocator import PageAllocator

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ours(model_path):
    return LlamaModel.from_pretrained(model_path)


def run_prefill(model, seqs, page_size, shuffle=False):
    cfg = model.config
    n_pages = sum(-(-len(s) // page_size) for s in seqs) + 4
    pool = KVPool(KVLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32),
                  page_size, num_pages=n_pages)
    alloc = PageAllocator(n_pages)
    if shuffle:  # scatter pages: tables are not contiguous
        alloc._free.reverse()
    tables = [alloc.allocate(-(-len(s) // page_size)) for s in seqs]
    batch = build_forward_batch(seqs, [0] * len(seqs), tables, page_size)
    return model(batch, pool, TorchAttentionBackend())


@pytest.mark.parametrize("page_size", [1, 16, 32])
def test_last_logits_match_hf_alone_and_batched(ours, hf_model, prompt_ids, page_size):
    seqs = prompt_ids[:5]
    batched = run_prefill(ours, seqs, page_size, shuffle=True)
    for i, s in enumerate(seqs):
        with torch.no_grad():
            ref = hf_model(torch.tensor([s])).logits[0, -1]
        alone = run_prefill(ours, [s], page_size)[0]
        assert (alone - ref).abs().max().item() <= 1e-3
        assert (batched[i] - ref).abs().max().item() <= 1e-3


@pytest.mark.parametrize("page_size", [1, 16, 32])
def test_greedy_48_tokens_match_hf_generate(model_path, oracle, prompt_ids, page_size):
    from agentlang.runtime import Engine, SamplingParams

    eng = Engine(model_path, page_size=page_size, kv_budget_mb=64)
    seqs = prompt_ids[:5]
    outs = eng.generate(seqs, SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))
    for s, o in zip(seqs, outs):
        ref = oracle.continuation(tuple(s), 48)
        oracle.assert_same(s, o.token_ids, list(ref), f"page_size={page_size}")
