"""K-quant super-blocks kept quantized (``runtime/quant/kquant.py``, ``kblock_linear.py``, the
native builds' ``kquant.h``): the repacked blocks decode bitwise to the ``gguf`` package's
values, the native matmul matches a float64 reference of them and is row-invariant, fused
linears of mixed types run as one chained weight, and whole files load quantized, against HF
transformers' GGUF loader and against the same file decoded to float32."""

import numpy as np
import pytest
import torch

from agentlang.runtime.models.gguf_model import load_gguf_model
from agentlang.runtime.quant.kblock_linear import ChainLinear, KBlockLinear
from agentlang.runtime.quant.kquant import dequantize, split_kblocks
from agentlang.runtime.quant import native
from agentlang.runtime.quant.native import kquant_library
from agentlang.runtime.weights.gguf_file import GgufError
from agentlang.runtime.weights.gguf_weights import block_linear
from tests.quant.test_block_linear import assert_same_at_one_thread, quantized_activations
from tests.support.gguf_files import BLOCK, K_DIMS, random_blocks, write_gguf

gguf = pytest.importorskip("gguf")
KTYPES = ["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"]


def gguf_decoded(raw: np.ndarray, qtype: str) -> np.ndarray:
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])


@pytest.fixture(scope="module")
def lib():
    """The build a model with K-quant tensors loads with here."""
    lib = kquant_library()
    if lib is None:
        pytest.skip("no native build with K-quant kernels runs here")
    return lib


@pytest.fixture(scope="module", params=[i.name for i in native.ISAS if i.kquants])
def build(request):
    """Each build with K-quant kernels, where this CPU runs it (an AVX-512 machine: both)."""
    isa = next((i for i in native.runnable_isas() if i.name == request.param), None)
    if isa is None:
        pytest.skip(f"this CPU cannot run the {request.param} build")
    return native.build_library(isa)


@pytest.mark.parametrize("qtype", KTYPES)
@pytest.mark.parametrize("scale", [(1e-3, 1e-2), (6e-8, 1e-6), (1.0, 6e4)])   # tiny to huge
def test_dequantization_is_bitwise_the_gguf_packages(qtype, scale):
    raw = random_blocks(qtype, 33, 768, seed=1, scale=scale)
    ref = gguf_decoded(raw, qtype)
    assert np.isfinite(ref).all()
    got = dequantize(split_kblocks(raw, qtype)).numpy()
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype", KTYPES)
@pytest.mark.parametrize("N,K", [(37, 256), (64, 768), (5, 1536), (9, 576)])
def test_native_matmul_matches_float64_reference(build, qtype, N, K):
    if K % 256 and qtype not in BLOCK:
        pytest.skip("K-quant rows are whole super-blocks")
    raw = random_blocks(qtype, N, K, seed=N + K)
    lin = KBlockLinear(build, split_kblocks(raw, qtype), bias=torch.arange(N, dtype=torch.float32))
    w = torch.from_numpy(gguf_decoded(raw, qtype)).double()
    assert torch.equal(lin.dequantize().double(), w)
    for T in (1, 3, 9, 37):                 # 37: through avx2/panel.h; avx512: row tiles
        x = torch.randn(T, K, generator=torch.Generator().manual_seed(N + K + T))  # not the
        # global generator, whose state depends on the tests run before in this worker
        ref = quantized_activations(x) @ w.T + torch.arange(N).double()
        assert ((lin(x).double() - ref).norm() / ref.norm()).item() < 1e-5


@pytest.mark.parametrize("qtype", KTYPES)
def test_each_row_is_the_same_alone_batched_and_at_any_thread_count(build, qtype):
    lin = KBlockLinear(build, split_kblocks(random_blocks(qtype, 203, 512), qtype))
    x = torch.randn(23, 512)
    together = lin(x)
    alone = torch.cat([lin(x[i:i + 1]) for i in range(23)])
    assert torch.equal(together, alone)
    for m in (2, 4, 5, 19, 20, 21):        # each path's tile shapes, both sides of PANEL_ROWS
        assert torch.equal(lin(x[:m]), alone[:m]), m
    assert_same_at_one_thread(lin, x, together)


def test_a_chain_of_mixed_kinds_is_its_parts_side_by_side(build):
    K = 512
    q8 = gguf.quants.quantize(np.random.default_rng(2).standard_normal((16, K)).astype(np.float32),
                              gguf.GGMLQuantizationType.Q8_0)
    parts = [KBlockLinear(build, split_kblocks(random_blocks("Q4_K", 64, K), "Q4_K"),
                          bias=torch.ones(64)),
             KBlockLinear(build, split_kblocks(random_blocks("Q6_K", 32, K, 3), "Q6_K")),
             block_linear(build, [(q8, "Q8_0")], bias=-torch.ones(16))]
    chain = ChainLinear(build, parts)
    for T in (1, 5, 24):
        x = torch.randn(T, K)
        assert torch.equal(chain(x), torch.cat([p(x) for p in parts], dim=1))
    assert chain.dequantize().shape == (112, K)
    assert torch.equal(parts[0](x), parts[0](x))           # a part still runs alone


@pytest.mark.parametrize("qtype", KTYPES)
def test_bf16_dequantization_is_the_gguf_value_rounded_to_nearest_even(build, qtype):
    K = 576 if qtype in BLOCK else 512
    raw = random_blocks(qtype, 21, K, seed=5, scale=(1e-3, 1.0))
    lin = KBlockLinear(build, split_kblocks(raw, qtype))
    w = build.dequantize_bf16(lin.qweight)
    ref = torch.from_numpy(gguf_decoded(raw, qtype)).to(torch.bfloat16)
    assert w.shape == (21, K) and torch.equal(w, ref)
    assert torch.equal(build.dequantize_bf16(lin.qweight, range(3, 20)), ref[3:20])


def test_bf16_gemm_rows_run_k_quants_and_chains_as_bf16_gemms(build):
    """A bfloat16 model's larger calls (tests/quant/test_block_linear.py for Q4 / Q8): the
    weight dequantized to bfloat16 for the call, each part of a chain with its own bias."""
    K = 512
    raws = [random_blocks("Q4_K", 40, K, 1), random_blocks("Q6_K", 24, K, 2)]
    biases = [torch.randn(40), None]
    parts = [KBlockLinear(build, split_kblocks(r, t), bias=b)
             for r, t, b in zip(raws, ("Q4_K", "Q6_K"), biases)]
    chain = ChainLinear(build, parts)
    small, large = torch.randn(3, K).bfloat16(), torch.randn(37, K).bfloat16()
    native_small = chain(small)
    for lin in (parts[0], chain):
        lin.use_bf16_gemms(4, torch.bfloat16)
        assert lin.input_dtype == torch.bfloat16
    assert torch.equal(chain(small), native_small)              # under 4 rows: the kernel
    w = torch.cat([torch.from_numpy(gguf_decoded(r, t)) for r, t in zip(raws, ("Q4_K", "Q6_K"))])
    bias = torch.cat([biases[0], torch.zeros(24)])
    y = chain(large)
    assert y.dtype == torch.bfloat16 and y.shape == (37, 64)
    assert torch.equal(y[:, :40], torch.nn.functional.linear(large, w[:40].bfloat16(), biases[0].bfloat16()))
    assert torch.equal(y[:, 40:], torch.nn.functional.linear(large, w[40:].bfloat16()))
    assert torch.equal(parts[0](large), y[:, :40])
    ref = large.double() @ w.double().T + bias.double()
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("qtype", KTYPES)
def test_file_kept_quantized_matches_hf_and_its_float32_decode(tmp_path, tokenizer_fields, lib, qtype):
    from tests.weights.test_gguf_loading import SEQS, hf_logits, prefill_logits

    path = write_gguf(tmp_path / "k.gguf", tokenizer_fields, qtype, dims=K_DIMS, tied=False)
    model = load_gguf_model(path, "auto", torch.float32)
    assert model.weights_report[qtype] == ("native blocks" if qtype in BLOCK else "native super-blocks")
    assert isinstance(model.lm_head, KBlockLinear)
    assert isinstance(model.layers[0].self_attn.qkv_proj, KBlockLinear)
    assert model.native_decoder is not None
    dense = load_gguf_model(path, "dense", torch.float32)
    got, dec = prefill_logits(model, SEQS), prefill_logits(dense, SEQS)
    for i, s in enumerate(SEQS):
        ref = hf_logits(path, s)
        assert ((got[i] - ref).norm() / ref.norm()).item() < 1e-3
        # the kernel's 16-bit activations through 2 layers and the head: ~1e-4
        assert ((got[i] - dec[i]).norm() / dec[i].norm()).item() < 5e-4


def test_top1_agrees_with_the_float32_decode_at_999_of_6400_positions(tmp_path, tokenizer_fields, lib):
    """50 prompts x 128 positions of a Q4_K_M-like mix (Q4_K, Q6_K attn_v / ffn_down / output)."""
    mix = {"attn_v": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K"}
    path = write_gguf(tmp_path / "km.gguf", tokenizer_fields, "Q4_K", dims=K_DIMS, tied=False,
                      types=mix)
    model, dense = load_gguf_model(path, "auto"), load_gguf_model(path, "dense")
    assert isinstance(model.layers[0].self_attn.qkv_proj, ChainLinear)       # Q4_K q, k + Q6_K v
    assert model.weights_report == {"Q4_K": "native super-blocks", "Q6_K": "native super-blocks"}
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    agree = total = 0
    for start in range(0, 50, 10):
        seqs = [torch.randint(0, vocab, (128,), generator=g).tolist() for _ in range(10)]
        a, b = all_logits(model, seqs), all_logits(dense, seqs)
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0]
    assert total == 6400 and agree / total >= 0.999, agree / total


def test_a_bfloat16_k_quant_model_runs_prefill_sized_calls_as_bf16_gemms(tmp_path, tokenizer_fields, lib):
    from agentlang.runtime.quant.block_linear import BF16_GEMM_ROWS
    from agentlang.runtime.quant.native.cpu_features import bf16_matmuls_in_hardware
    from tests.weights.test_gguf_loading import hf_logits, prefill_logits

    path = write_gguf(tmp_path / "km.gguf", tokenizer_fields, "Q4_K", dims=K_DIMS, tied=False,
                      types={"attn_v": "Q6_K"})
    model = load_gguf_model(path, "auto", torch.bfloat16)
    qkv, up = model.layers[0].self_attn.qkv_proj, model.layers[0].mlp.gate_up_proj
    assert isinstance(qkv, ChainLinear) and isinstance(up, KBlockLinear)
    want = BF16_GEMM_ROWS if bf16_matmuls_in_hardware() else None   # else oneDNN emulates bf16
    assert qkv.bf16_gemm_rows == want and up.bf16_gemm_rows == want
    assert load_gguf_model(path, "auto", torch.float32).layers[0].mlp.gate_up_proj.bf16_gemm_rows is None
    seq = [(7 * i) % 200 + 1 for i in range(BF16_GEMM_ROWS + 20)]          # one GEMM-sized call
    out, ref = prefill_logits(model, [seq])[0].float(), hf_logits(path, seq)
    assert ((out - ref).norm() / ref.norm()).item() < 0.03


def all_logits(model, seqs):
    """Logits at every position of every sequence, ``[sum of lengths, V]``."""
    from agentlang.runtime.attention.forward_batch import build_forward_batch
    from agentlang.runtime.attention.torch_backend import TorchAttentionBackend
    from agentlang.runtime.cache.kv_pool import KVLayout, KVPool

    cfg, ps = model.config, 16
    pages = [-(-len(s) // ps) for s in seqs]
    pool = KVPool(KVLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32), ps,
                  num_pages=sum(pages) + 1)
    tables = [list(range(1 + sum(pages[:i]), 1 + sum(pages[:i + 1]))) for i in range(len(seqs))]
    batch = build_forward_batch(seqs, [0] * len(seqs), tables, ps,
                                logits_rows=[list(range(len(s))) for s in seqs])
    return model(batch, pool, TorchAttentionBackend())


def test_bad_k_quant_files_are_rejected(tmp_path, tokenizer_fields):
    good = write_gguf(tmp_path / "g.gguf", tokenizer_fields, "Q4_K", dims=K_DIMS)
    data = good.read_bytes()
    (tmp_path / "t.gguf").write_bytes(data[:len(data) - 100])               # a cut super-block
    with pytest.raises(GgufError, match="truncated file: tensor .* ends at byte"):
        load_gguf_model(tmp_path / "t.gguf")
    name = b"token_embd.weight"
    at = data.index(name) + len(name)                    # then n_dims (u32), ne0 (u64): K
    assert int.from_bytes(data[at + 4:at + 12], "little") == K_DIMS[0]
    bad = data[:at + 4] + (64).to_bytes(8, "little") + data[at + 12:]
    (tmp_path / "s.gguf").write_bytes(bad)                # rows claimed 64 wide: no super-block
    with pytest.raises(GgufError, match="token_embd.weight rows of 64 are not whole Q4_K blocks of 256"):
        load_gguf_model(tmp_path / "s.gguf")


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K"])
def test_q2_k_and_q3_k_are_decoded_and_the_loader_says_so(tmp_path, tokenizer_fields, qtype):
    path = write_gguf(tmp_path / "k.gguf", tokenizer_fields, qtype, dims=K_DIMS)
    assert load_gguf_model(path, "auto").weights_report[qtype] == "dense float32"
