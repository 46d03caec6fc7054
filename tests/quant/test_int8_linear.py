"""``weights="int8"``: the native quantize / rescale passes (``int8.c``) against their formulas
in torch, :class:`Int8Linear` against float64 references of the same integer products, its
batch invariance, SmoothQuant's smoothing, and the engine / server option."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from agentlang.runtime.quant import int8_linear
from agentlang.runtime.quant.int8_linear import Int8Linear, smoothing
from agentlang.runtime.quant.native.int8_rows import Int8Rows

DTYPES = [torch.float32, torch.bfloat16]


def rows(m, k, dtype, seed=0, outlier=None):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 2
    if outlier is not None:
        x[:, outlier] *= 60                       # one channel far larger than the rest
    x[min(3, m - 1)] = 0                          # a zero row
    return x.to(dtype)


def torch_quantize(x, mul=None):
    """The module's formulas, spelled out (float32, a true division for 127 / a)."""
    y = x.float() if mul is None else x.float() * mul
    a = y.abs().amax(-1)
    inv = torch.where(a > 0, torch.full_like(a, 127.0) / torch.where(a > 0, a, 1.0), 0.0)
    return (torch.round(y * inv[:, None]).clamp(-127, 127).to(torch.int8),
            torch.where(a > 0, a / 127.0, 0.0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [576, 203, 7])
def test_native_quantize_is_the_formula(native_lib, dtype, k):
    x = rows(37, k, dtype, seed=k)
    mul = torch.rand(k, generator=torch.Generator().manual_seed(1)) + 0.5
    for m in (None, mul):
        q, s = Int8Rows(native_lib).quantize(x, m)
        rq, rs = torch_quantize(x, m)
        assert torch.equal(q, rq) and torch.equal(s, rs)
        y = x.double() if m is None else x.double() * m.double()
        err = (q.double() - y * (127 / y.abs().amax(-1, keepdim=True).clamp_min(1e-30)))
        assert err.abs().max() <= 0.5 + 1e-4       # the nearest integer, within float32's error
        assert q[3].abs().sum() == 0 and s[3] == 0  # a zero row: zeros, scale 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_native_rescale_is_the_formula(native_lib, dtype, bias):
    g = torch.Generator().manual_seed(2)
    acc = torch.randint(-2 ** 24, 2 ** 24, (29, 77), dtype=torch.int32, generator=g)
    sx, sw = torch.rand(29, generator=g), torch.rand(77, generator=g)
    b = torch.randn(77, generator=g) if bias else None
    out = Int8Rows(native_lib).dequantize(acc, sx, sw, b, dtype)
    ref = acc.float() * sw * sx[:, None]
    assert torch.equal(out, (ref if b is None else ref + b).to(dtype))


def test_bad_shapes_are_refused(native_lib):
    k = Int8Rows(native_lib)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        k.quantize(torch.zeros(2, 3, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"mul must be contiguous float32 \[3\]"):
        k.quantize(torch.zeros(2, 3), torch.ones(4))
    with pytest.raises(ValueError, match=r"col_scale must be contiguous float32 \[5\]"):
        k.dequantize(torch.zeros(2, 5, dtype=torch.int32), torch.ones(2), torch.ones(4), None,
                     torch.float32)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_is_its_integer_products_rescaled(monkeypatch, native, dtype):
    if not native:
        monkeypatch.setattr(int8_linear, "int8_rows", lambda: None)   # torch's ops instead
    lin = nn.Linear(96, 40, bias=True)
    m = Int8Linear(lin.to(dtype))
    x = rows(21, 96, dtype, seed=5)
    out = m(x)
    qx, sx = torch_quantize(x)
    qw, sw = torch_quantize(lin.weight.detach())
    assert torch.equal(m.qweight, qw) and torch.equal(m.scale, sw)
    exact = (qx.double() @ qw.double().T) * sw.double() * sx.double()[:, None] + lin.bias.double()
    assert out.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 2 ** -8
    assert torch.allclose(out.double(), exact, rtol=tol, atol=tol * exact.abs().max().item())
    # and close to the float64 linear: the two int8 roundings, not more
    ref = F.linear(x.double(), lin.weight.double(), lin.bias.double())
    assert (out.double() - ref).abs().max() <= 0.03 * ref.abs().max()


def test_a_rows_result_does_not_depend_on_the_batch():
    lin = nn.Linear(576, 1536, bias=False).bfloat16()
    m = Int8Linear(lin)
    x = rows(300, 576, torch.bfloat16, seed=7)
    full = m(x)
    for lo, hi in ((0, 1), (5, 6), (17, 81), (250, 300)):
        assert torch.equal(m(x[lo:hi].contiguous()), full[lo:hi])


def test_smoothing_keeps_an_outlier_channel_from_costing_the_rest():
    torch.manual_seed(0)
    lin = nn.Linear(256, 64, bias=False)
    x = rows(64, 256, torch.float32, seed=9, outlier=17)
    ref = F.linear(x.double(), lin.weight.double())
    s = smoothing(x.abs().amax(0), lin.weight)
    plain = (Int8Linear(lin)(x).double() - ref).norm() / ref.norm()
    smooth = Int8Linear(lin, s)(x).double() - ref
    assert smooth.norm() / ref.norm() < 0.5 * plain           # measured: ~0.2x
    assert torch.allclose(torch.tensor(1.0), (s * Int8Linear(lin, s).inv_smooth).mean())


def test_engine_option_and_its_errors():
    from agentlang.runtime.engine.config import EngineConfig

    with pytest.raises(ValueError, match=r"weights must be one of \['auto', 'dense', 'int8'\], "
                                         r"got 'int4'"):
        EngineConfig(weights="int4").validate()
    with pytest.raises(ValueError, match="weights='int8' runs on the CPU only, got device 'cuda'"):
        EngineConfig(weights="int8", device="cuda").validate()
    with pytest.raises(ValueError, match="Int8Linear takes float32 or bfloat16 inputs"):
        Int8Linear(nn.Linear(4, 4))(torch.zeros(1, 4, dtype=torch.float16))


def test_int8_is_refused_on_a_cpu_without_int8_dot_products(monkeypatch):
    """An AVX2-only CPU runs oneDNN's int8 GEMM on a reference path (~15x slower than float32
    here): the option is refused there, naming the instructions it needs and the alternatives."""
    from agentlang.runtime.engine import config
    from agentlang.runtime.quant.native.cpu_features import int8_matmuls_in_hardware

    assert not int8_matmuls_in_hardware(frozenset({"avx2", "fma", "f16c"}))
    assert int8_matmuls_in_hardware(frozenset({"avx2", "avx512_vnni"}))
    assert int8_matmuls_in_hardware(frozenset({"avx2", "avx_vnni"}))
    assert int8_matmuls_in_hardware(frozenset())           # flags unknown: not refused
    monkeypatch.setattr(config, "int8_matmuls_in_hardware", lambda: False)
    with pytest.raises(ValueError, match=r"weights='int8' needs a CPU with int8 dot products "
                                         r"\(avx512_vnni, avx_vnni, amx_int8\).*use weights "
                                         r"'auto' or 'dense'"):
        config.EngineConfig(weights="int8").validate()
    config.EngineConfig(weights="auto").validate()
    monkeypatch.setattr(config, "int8_matmuls_in_hardware", lambda: True)
    config.EngineConfig(weights="int8").validate()


def test_engine_int8_batched_equals_alone(monkeypatch):
    from agentlang.runtime import Engine, SamplingParams
    from agentlang.runtime.engine import config

    # the path's results, on any CPU (without int8 dot products it is only slow)
    monkeypatch.setattr(config, "int8_matmuls_in_hardware", lambda: True)
    eng = Engine(weights="int8", dtype="bfloat16", kv_budget_mb=64)
    assert sum(isinstance(m, Int8Linear) for m in eng.model.modules()) == 30 * 4 + 1
    prompts = [eng.tokenizer.encode(p) for p in (
        "The capital of France is", "Write a haiku about the sea.",
        "List three prime numbers:", "def fibonacci(n):")]
    p = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    alone = [eng.generate(x, p).token_ids for x in prompts]
    assert [o.token_ids for o in eng.generate(prompts, p)] == alone
    assert "Paris" in eng.tokenizer.decode(alone[0])
