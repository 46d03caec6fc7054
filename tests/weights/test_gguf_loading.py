"""GGUF files loaded by path: kept quantized (Q4_0/Q4_1/Q8_0) or decoded, against HF transformers'
own GGUF loader (which dequantizes with the ``gguf`` package) as the oracle; bad files rejected.

The test files are tiny random Llama / Qwen2 models written with the ``gguf`` package into tmp
dirs, with a tiny byte-level BPE tokenizer in their metadata (so the engine can load them).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentlang.runtime.attention.torch_backend import TorchAttentionBackend
from agentlang.runtime.quant.block_linear import BF16_GEMM_ROWS, BlockLinear
from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.weights.gguf_file import GgufError
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.weights.model_loader import resolve_model
from agentlang.runtime.models.gguf_model import load_gguf_model
from agentlang.runtime.quant.native import kquant_library, qmatmul_library
from agentlang.runtime.quant.native.cpu_features import bf16_matmuls_in_hardware
from agentlang.runtime.cache.page_allocator import PageAllocator
from agentlang.runtime.quant.quant_linear import QuantEmbedding, QuantLinear
from tests.support.gguf_files import K_DIMS, L, SMALL, write_gguf

H = SMALL[0]


def prefill_logits(model, seqs, page_size=16):
    cfg = model.config
    n_pages = sum(-(-len(s) // page_size) for s in seqs) + 2
    dtype = model.norm.weight.dtype
    pool = KVPool(KVLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype), page_size,
                  num_pages=n_pages)
    alloc = PageAllocator(n_pages)
    tables = [alloc.allocate(-(-len(s) // page_size)) for s in seqs]
    batch = build_forward_batch(seqs, [0] * len(seqs), tables, page_size)
    return model(batch, pool, TorchAttentionBackend())


def hf_logits(path, seq):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        return hf.eval()(torch.tensor([seq])).logits[0, -1]


SEQS = [[1, 50, 258, 82, 49, 14], list(range(100, 140)), [7, 8, 9]]


def quant_class(kernels: str) -> type:
    """The linear class ``weights="auto"`` builds for Q4_0/Q4_1/Q8_0 with ``kernels``."""
    return BlockLinear if kernels == "auto" and qmatmul_library() is not None else QuantLinear


@pytest.mark.parametrize("kernels", ["auto", "torch"])
@pytest.mark.parametrize("qtype,arch,tied", [("Q4_1", "llama", True), ("Q4_0", "qwen2", False),
                                             ("Q8_0", "llama", False), ("Q5_0", "llama", True),
                                             ("Q5_1", "qwen2", True)])
def test_matches_hf_gguf_loader(tmp_path, tokenizer_fields, qtype, arch, tied, kernels):
    path = write_gguf(tmp_path / f"m.{qtype}.gguf", tokenizer_fields, qtype, arch, tied=tied)
    dense = load_gguf_model(path, "dense", torch.float32)
    quant = load_gguf_model(path, "auto", torch.float32, kernels=kernels)
    cls = quant_class(kernels)
    # Q5_0 / Q5_1: native blocks where a build with those kernels runs (tests/quant/test_kquant.py)
    kept = qtype in ("Q4_0", "Q4_1", "Q8_0") or (
        kernels == "auto" and cls is BlockLinear and kquant_library() is not None)
    assert isinstance(quant.lm_head, cls) == kept
    assert isinstance(quant.layers[0].mlp.down_proj, cls) == kept
    assert isinstance(quant.embed_tokens, QuantEmbedding) == kept
    assert qtype in quant.weights_report
    d_out, q_out = prefill_logits(dense, SEQS), prefill_logits(quant, SEQS)
    for i, s in enumerate(SEQS):
        ref = hf_logits(path, s)
        assert (d_out[i] - ref).abs().max().item() < 1e-3          # decoding + q/k order exact
        rel = ((q_out[i] - ref).norm() / ref.norm()).item()
        # bf16 matmuls (+ Q8_0's re-scale to one scale a row) or 8-bit activations (native)
        assert rel < (0.03 if qtype == "Q8_0" and cls is QuantLinear else 0.02), rel


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_a_bfloat16_model_runs_prefill_sized_calls_as_bf16_gemms(tmp_path, tokenizer_fields, qtype):
    if quant_class("auto") is not BlockLinear:
        pytest.skip("native kernels unavailable here")
    path = write_gguf(tmp_path / f"m.{qtype}.gguf", tokenizer_fields, qtype)
    model = load_gguf_model(path, "auto", torch.bfloat16)
    lin = model.layers[0].mlp.gate_up_proj
    if not bf16_matmuls_in_hardware():
        assert lin.bf16_gemm_rows is None                  # oneDNN would emulate bf16 here
        return
    assert isinstance(lin, BlockLinear) and lin.bf16_gemm_rows == BF16_GEMM_ROWS
    assert model.layers[0].input_layernorm.out_dtype == torch.bfloat16      # no float32 detour
    assert load_gguf_model(path, "auto", torch.float32).layers[0].mlp.gate_up_proj.bf16_gemm_rows is None
    seq = [(7 * i) % 200 + 1 for i in range(BF16_GEMM_ROWS + 20)]          # one GEMM-sized call
    out, ref = prefill_logits(model, [seq])[0].float(), hf_logits(path, seq)
    assert ((out - ref).norm() / ref.norm()).item() < 0.03


def test_a_float32_model_with_bf16_gemm_rows_prefills_in_bf16_and_decodes_exactly(
        tmp_path, tokenizer_fields):
    """``bf16_gemm_rows`` on a float32 model: activations stay float32 (norms hand over
    float32, the one-call decode layer is kept), a prefill of that many tokens or more runs its
    linears as bf16 GEMMs (close to HF at bf16's precision, not the float32 model's bits), a
    shorter call gives the float32 model's logits bit for bit."""
    if quant_class("auto") is not BlockLinear or not bf16_matmuls_in_hardware():
        pytest.skip("needs the native kernels and a CPU with bf16 instructions")
    path = write_gguf(tmp_path / "m.Q4_1.gguf", tokenizer_fields, "Q4_1")
    plain = load_gguf_model(path, "auto", torch.float32)
    rows = 41                     # fewer tokens: the decode layer; this many: torch's layers
    model = load_gguf_model(path, "auto", torch.float32, bf16_gemm_rows=rows)
    lin = model.layers[0].mlp.gate_up_proj
    assert lin.bf16_gemm_rows == rows and lin.input_dtype == torch.float32
    assert model.layers[0].input_layernorm.out_dtype in (None, torch.float32)
    assert model.native_decoder is not None
    long = [(7 * i) % 200 + 1 for i in range(rows + 20)]
    short = long[:rows - 4]
    out = prefill_logits(model, [long])[0]
    assert out.dtype == torch.float32
    assert not torch.equal(out, prefill_logits(plain, [long])[0])
    ref = hf_logits(path, long)
    assert ((out - ref).norm() / ref.norm()).item() < 0.03
    assert torch.equal(prefill_logits(model, [short])[0], prefill_logits(plain, [short])[0])


@pytest.mark.parametrize("qtype", ["Q6_K", "Q4_K"])
def test_k_quant_blocks_are_decoded_dense_without_k_quant_kernels(tmp_path, tokenizer_fields, qtype):
    """``kernels="torch"`` (or no native build with K-quant kernels): decoded to the compute
    dtype and reported (tests/quant/test_kquant.py: kept quantized)."""
    path = write_gguf(tmp_path / "k.gguf", tokenizer_fields, qtype, embed_type="Q8_0", dims=K_DIMS)
    model = load_gguf_model(path, "auto", torch.float32, kernels="torch")
    assert model.weights_report[qtype] == "dense float32"
    assert model.weights_report["Q8_0"] == "int8 per row"
    out = prefill_logits(model, SEQS[:1])[0]
    ref = hf_logits(path, SEQS[0])
    assert ((out - ref).norm() / ref.norm()).item() < 0.02
    model = load_gguf_model(path, "auto", torch.float32)
    assert model.weights_report[qtype] == ("native super-blocks" if kquant_library() else "dense float32")
    assert model.weights_report["Q8_0"] == ("native blocks" if quant_class("auto") is BlockLinear
                                            else "int8 per row")
    out = prefill_logits(model, SEQS[:1])[0]
    ref = hf_logits(path, SEQS[0])
    assert ((out - ref).norm() / ref.norm()).item() < 0.02


def test_engine_loads_a_gguf_by_path(tmp_path, tokenizer_fields):
    from agentlang.runtime import Engine, SamplingParams

    path = write_gguf(tmp_path / "tiny.gguf", tokenizer_fields, "Q4_1")
    eng = Engine(str(path), weights="auto", kv_budget_mb=8, page_size=4)
    assert eng.model_name == "tiny" and eng.model_config.num_layers == L
    outs = eng.generate(["Hello there", "The capital of France is"],
                        SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [6, 6]
    eng.flush_cache()
    assert eng.allocator.num_free == eng.pool.num_pages
    from agentlang.runtime.models.kv_plan import describe_engine

    stored = describe_engine(eng)["weights_bytes"]        # quantized buffers are counted
    assert 0.5 * path.stat().st_size < stored < 2 * path.stat().st_size


def test_an_engine_with_bf16_gemm_rows_hands_it_to_its_linears_and_attention(
        tmp_path, tokenizer_fields):
    """``Engine(bf16_gemm_rows=N)`` on a float32 GGUF: the native linears and the torch
    attention backend both take N; a long prompt (one GEMM-sized step) and its decode run,
    and the pool is whole again after a flush."""
    from agentlang.runtime import Engine, SamplingParams

    if quant_class("auto") is not BlockLinear or not bf16_matmuls_in_hardware():
        pytest.skip("needs the native kernels and a CPU with bf16 instructions")
    path = write_gguf(tmp_path / "tiny.gguf", tokenizer_fields, "Q4_1")
    eng = Engine(str(path), weights="auto", kv_budget_mb=8, page_size=4, bf16_gemm_rows=40)
    assert eng.backend.bf16_rows == 40
    assert {m.bf16_gemm_rows for layer in eng.model.layers
            for m in (layer.mlp.gate_up_proj, layer.self_attn.qkv_proj)} == {40}
    prompt = [(7 * i) % 200 + 1 for i in range(90)]
    out = eng.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert len(out[0].token_ids) == 6
    eng.flush_cache()
    assert eng.allocator.num_free == eng.pool.num_pages


def test_bad_files_are_rejected_with_the_reason(tmp_path, tokenizer_fields):
    good = write_gguf(tmp_path / "good.gguf", tokenizer_fields, "Q4_0")
    data = good.read_bytes()
    (tmp_path / "trunc.gguf").write_bytes(data[: len(data) - 5000])
    with pytest.raises(GgufError, match="truncated"):
        load_gguf_model(tmp_path / "trunc.gguf")
    (tmp_path / "header.gguf").write_bytes(data[:100])
    with pytest.raises(GgufError, match="truncated or corrupt|truncated"):
        load_gguf_model(tmp_path / "header.gguf")
    with pytest.raises(GgufError, match="unsupported GGUF architecture 'gpt2'.*llama, mistral, qwen2, qwen3, phi3"):
        load_gguf_model(write_gguf(tmp_path / "gpt2.gguf", tokenizer_fields, "Q4_0", arch="gpt2"))
    with pytest.raises(GgufError, match=r"attn_q.weight has shape \[80, 64\].*implies \[64, 64\]"):
        load_gguf_model(write_gguf(tmp_path / "shape.gguf", tokenizer_fields, "Q8_0",
                                   shapes={"attn_q": (80, H)}))
    with pytest.raises(GgufError, match="unsupported type IQ4_NL.*Q4_0, Q4_1, Q8_0"):
        load_gguf_model(write_gguf(tmp_path / "iq.gguf", tokenizer_fields, "IQ4_NL"))
    with pytest.raises(GgufError, match="does not exist"):
        load_gguf_model(tmp_path / "none.gguf")
    with pytest.raises(ValueError, match="weights must be"):
        load_gguf_model(good, "int3")


def test_embedded_file_in_bf16_batches_through_gemms_and_still_answers(monkeypatch):
    """dtype=bfloat16 on the embedded Q4_1 file: a batch of 40 runs its prefill and decode rows
    through bf16 GEMMs (batch-dependent rounding, so no bitwise claim), and the answer holds."""
    if not (quant_class("auto") is BlockLinear and bf16_matmuls_in_hardware()):
        pytest.skip("needs the native kernels and bf16 instructions")
    from agentlang.runtime import Engine, SamplingParams

    calls = []
    gemm = BlockLinear.bf16_gemm
    monkeypatch.setattr(BlockLinear, "bf16_gemm", lambda self, x: calls.append(x.shape[0]) or gemm(self, x))
    eng = Engine(resolve_model("default", "auto").path, weights="auto", dtype="bfloat16",
                 kv_budget_mb=64)
    p = SamplingParams(max_tokens=8, temperature=0)
    alone = eng.generate("The capital of France is", p).text
    assert calls == [] and alone.startswith(" Paris")                # 6 rows: the native kernel
    outs = eng.generate(["The capital of France is"] + ["List three colors:"] * 39, p)
    assert min(calls) >= BF16_GEMM_ROWS and max(calls) >= 40          # decode steps of 40 rows
    assert outs[0].text.startswith(" Paris") and len({o.text for o in outs[1:]}) == 1
