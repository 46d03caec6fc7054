"""The native matmul over GGUF blocks (``runtime/quant/native``, ``runtime/quant/block_linear.py``) against
float64 references: the file's blocks decoded exactly, activations quantized per 32 values as
the kernel documents. Row invariance is bitwise: alone, batched, and with 1 or 2 threads. Each
test runs on every build of the library the CPU runs (``native_lib``: AVX-512 and AVX2)."""

import numpy as np
import pytest
import torch

from agentlang.runtime.quant.block_linear import BlockLinear
from agentlang.runtime.weights.gguf_weights import block_linear
from agentlang.runtime.quant.native import KIND_Q4, KIND_Q8
from agentlang.runtime.quant.quant_linear import QuantEmbedding

gguf = pytest.importorskip("gguf")


@pytest.fixture
def lib(native_lib):
    return native_lib


def gguf_rows(w: np.ndarray, qtype: str) -> np.ndarray:
    """float32 ``[N, K]`` → the GGUF encoding's raw rows (uint8 ``[N, bytes]``)."""
    return gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])


def decoded(raw: np.ndarray, qtype: str) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])).double()


def quantized_activations(x: torch.Tensor, qmax: int = 32767) -> torch.Tensor:
    """What the kernel multiplies: per 32 values q = round(x * (qmax / amax)) in float32,
    x ~ q * fl32(amax / qmax). qmax 32767: the kernel's int16; 127: llama.cpp's 8-bit
    activations, for comparison."""
    b = x.view(x.shape[0], -1, 32)
    amax = b.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, qmax / amax, torch.zeros_like(amax))
    return (torch.round(b * inv).double() * (amax / qmax).double()).view_as(x)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("N,K", [(960, 576), (33, 96), (5, 32), (7, 160), (130, 1536)])
def test_matches_float64_reference_of_the_file_blocks(lib, qtype, N, K):
    torch.manual_seed(N + K)
    raw = gguf_rows(torch.randn(N, K).numpy(), qtype)
    lin = block_linear(lib, [(raw, qtype)], bias=torch.arange(N, dtype=torch.float32))
    w = decoded(raw, qtype)
    assert torch.equal(lin.dequantize().double(), w)              # the file's values, exactly
    for T in (1, 4, 37):
        x = torch.randn(T, K)
        y = lin(x)
        assert y.shape == (T, N) and y.dtype == torch.float32
        ref = quantized_activations(x) @ w.T + torch.arange(N).double()
        assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-5
        full = x.double() @ w.T + torch.arange(N).double()
        err = ((y.double() - full).norm() / full.norm()).item()
        coarse = quantized_activations(x, 127) @ w.T + torch.arange(N).double()
        assert err < 2e-4 < ((coarse - full).norm() / full.norm()).item(), err  # 16 vs 8 bits
    assert lin(torch.randn(2, K, dtype=torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_each_row_is_the_same_alone_batched_and_at_any_thread_count(lib, qtype):
    raw = gguf_rows(torch.randn(203, 576).numpy(), qtype)          # 4-column tiles and 1-column tails
    lin = block_linear(lib, [(raw, qtype)])
    x = torch.randn(23, 576)
    together = lin(x)
    alone = torch.cat([lin(x[i:i + 1]) for i in range(23)])
    assert torch.equal(together, alone)
    for m in (2, 3, 5, 6, 7, 19, 20, 21):   # every tile shape and both sides of avx2's PANEL_ROWS
        assert torch.equal(lin(x[:m]), alone[:m]), m
    assert_same_at_one_thread(lin, x, together)


def assert_same_at_one_thread(lin, x: torch.Tensor, expected: torch.Tensor) -> None:
    """``lin(x)`` with one OpenMP thread is bitwise ``expected`` (computed with more)."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(lin(x), expected)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("N,K", [(33, 96), (7, 160), (130, 1536)])
def test_bf16_dequantization_is_the_exact_weight_rounded_to_nearest_even(lib, qtype, N, K):
    torch.manual_seed(N * K)
    lin = block_linear(lib, [(gguf_rows(torch.randn(N, K).numpy(), qtype), qtype)])
    w = lib.dequantize_bf16(lin.qweight)
    assert w.shape == (N, K) and w.dtype == torch.bfloat16
    assert torch.equal(w, lin.dequantize().to(torch.bfloat16))
    assert torch.equal(lib.dequantize_bf16(lin.qweight, range(2, N - 1)), w[2:N - 1])
    with pytest.raises(ValueError, match="consecutive range within"):
        lib.dequantize_bf16(lin.qweight, range(0, N + 1))


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_calls_from_bf16_gemm_rows_on_run_bf16_gemms(lib, qtype, monkeypatch):
    N, K = 70, 160
    raw = gguf_rows(torch.randn(N, K).numpy(), qtype)
    lin = block_linear(lib, [(raw, qtype)], bias=torch.randn(N))
    assert lin.input_dtype == torch.float32
    small, large = torch.randn(3, K).bfloat16(), torch.randn(37, K).bfloat16()
    native_small, native_large = lin(small), lin(large)
    lin.use_bf16_gemms(4, torch.bfloat16)
    assert lin.input_dtype == torch.bfloat16
    assert torch.equal(lin(small), native_small)                 # under 4 rows: the native kernel
    y = lin(large)
    w = decoded(raw, qtype)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, torch.nn.functional.linear(large, w.bfloat16(), lin.bias.bfloat16()))
    assert not torch.equal(y, native_large)
    ref = large.double() @ w.T + lin.bias.double()
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2    # bf16 rounding, no worse
    assert lin(large.float()).dtype == torch.float32
    monkeypatch.setattr("agentlang.runtime.quant.block_linear.GEMM_SLICE_BYTES", 2 * K * 16)   # 5 slices of rows
    assert torch.allclose(lin(large).float(), y.float(), rtol=1e-2, atol=1e-2)
    assert ((lin(large).double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_a_float32_layer_with_bf16_gemm_rows_casts_only_the_large_calls(lib, qtype):
    """A float32 model's layer (``use_bf16_gemms(rows, float32)``): its inputs stay float32,
    calls under ``rows`` are the exact native ones, larger calls the bf16 GEMM of the input
    rounded to bfloat16, returned as float32."""
    N, K = 70, 160
    raw = gguf_rows(torch.randn(N, K).numpy(), qtype)
    lin = block_linear(lib, [(raw, qtype)], bias=torch.randn(N))
    small, large = torch.randn(5, K), torch.randn(40, K)
    native_small, native_large = lin(small), lin(large)
    lin.use_bf16_gemms(8, torch.float32)
    assert lin.input_dtype == torch.float32 and lin.bf16_gemm_rows == 8
    assert torch.equal(lin(small), native_small)
    y = lin(large)
    w = decoded(raw, qtype)
    assert y.dtype == torch.float32 and not torch.equal(y, native_large)
    want = torch.nn.functional.linear(large.bfloat16(), w.bfloat16(), lin.bias.bfloat16()).float()
    assert torch.equal(y, want)
    lin.use_bf16_gemms(None, torch.float32)
    assert torch.equal(lin(large), native_large)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="bf16_gemm_rows must be an integer >= 1"):
            lin.use_bf16_gemms(bad, torch.float32)


def test_fused_q4_0_and_q4_1_parts_and_embedding_rows(lib):
    a = gguf_rows(torch.randn(16, 64).numpy(), "Q4_0")
    b = gguf_rows(torch.randn(24, 64).numpy(), "Q4_1")
    lin = block_linear(lib, [(a, "Q4_0"), (b, "Q4_1")])
    w = torch.cat([decoded(a, "Q4_0"), decoded(b, "Q4_1")])
    assert lin.out_features == 40 and lin.in_features == 64
    assert torch.equal(lin.dequantize().double(), w)
    x = torch.randn(3, 64)
    ref = quantized_activations(x) @ w.T
    assert ((lin(x).double() - ref).norm() / ref.norm()).item() < 1e-5
    ids = torch.tensor([0, 15, 16, 39, 3])
    assert torch.equal(QuantEmbedding(lin, torch.float32)(ids).double(), w[ids])
    with pytest.raises(ValueError, match="cannot mix Q8_0"):
        block_linear(lib, [(a, "Q4_0"), (gguf_rows(torch.randn(8, 64).numpy(), "Q8_0"), "Q8_0")])


def test_bad_shapes_and_kinds(lib):
    with pytest.raises(ValueError, match="kind must be 4"):
        BlockLinear(lib, 5, 32, 1, torch.zeros(1, 16, dtype=torch.uint8),
                    torch.zeros(1, 1, dtype=torch.float16), None)
    with pytest.raises(ValueError, match="in_features must be a multiple of 32"):
        BlockLinear(lib, KIND_Q8, 48, 1, torch.zeros(1, 48, dtype=torch.int8),
                    torch.zeros(1, 1, dtype=torch.float16), None)
    assert KIND_Q4 != KIND_Q8


def test_engine_bf16_gemm_rows_is_validated_naming_the_field(monkeypatch):
    """``bf16_gemm_rows``: an integer >= 1 for a GGUF's quantized weights (``weights="auto"``)
    on the CPU, in float32 or bfloat16, on a CPU with bf16 instructions; anything else is
    refused naming the field and what it accepts."""
    from agentlang.runtime.engine import config

    monkeypatch.setattr(config, "bf16_matmuls_in_hardware", lambda: True)
    config.EngineConfig(weights="auto", bf16_gemm_rows=64).validate()
    config.EngineConfig(weights="auto", dtype="bfloat16", bf16_gemm_rows=16).validate()
    config.EngineConfig(weights="dense").validate()                    # unset: anything goes
    for bad in (0, -1, 1.5, True, "64", 1 << 21):
        with pytest.raises(ValueError, match=r"bf16_gemm_rows must be an integer in \[1, "):
            config.EngineConfig(weights="auto", bf16_gemm_rows=bad).validate()
    with pytest.raises(ValueError, match="bf16_gemm_rows applies to a GGUF's quantized weights "
                                         r"on the CPU \(weights 'auto', device 'cpu'\), got "
                                         "weights 'dense'"):
        config.EngineConfig(weights="dense", bf16_gemm_rows=64).validate()
    with pytest.raises(ValueError, match="bf16_gemm_rows applies to dtype 'float32' or "
                                         "'bfloat16', got 'float16'"):
        config.EngineConfig(weights="auto", dtype="float16", bf16_gemm_rows=64).validate()
    monkeypatch.setattr(config, "bf16_matmuls_in_hardware", lambda: False)
    with pytest.raises(ValueError, match=r"bf16_gemm_rows needs a CPU with bf16 instructions "
                                         r"\(avx512_bf16, amx_bf16\)"):
        config.EngineConfig(weights="auto", bf16_gemm_rows=64).validate()
