"""Which build of the native library runs (``runtime/quant/native/__init__.py``): the best the
CPU's flags allow, ``AGENTLANG_NATIVE`` choosing one or none, a clear reason otherwise; and the
AVX2 and AVX-512 builds computing the same products where both run."""

import pytest
import torch

import agentlang.runtime.quant.native as native

AVX2_ONLY = frozenset({"avx2", "fma", "f16c", "sse4_2"})
AVX512 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}


@pytest.fixture
def cpu(monkeypatch):
    """Set the CPU flags the selection sees (and a compiler that exists)."""
    monkeypatch.setattr(native, "_compiler", lambda: "cc")

    def use(flags, wanted=None):
        monkeypatch.setattr(native, "cpu_flags", lambda: flags)
        if wanted is None:
            monkeypatch.delenv("AGENTLANG_NATIVE", raising=False)
        else:
            monkeypatch.setenv("AGENTLANG_NATIVE", wanted)
        return native.chosen_isa()
    return use


def test_the_best_build_the_cpu_runs_is_chosen(cpu):
    assert cpu(AVX512)[0].name == "avx512"
    assert cpu(AVX2_ONLY)[0].name == "avx2"
    assert cpu(AVX512, "1")[0].name == "avx512"
    assert [i.name for i in native.runnable_isas()] == ["avx512", "avx2"]
    cpu(AVX2_ONLY)
    assert [i.name for i in native.runnable_isas()] == ["avx2"]


def test_agentlang_native_picks_a_build_or_none(cpu):
    assert cpu(AVX512, "avx2") == (native.ISAS[1], None)             # AVX-512 runs AVX2 too
    assert cpu(AVX512, "0") == (None, "AGENTLANG_NATIVE=0")
    isa, why = cpu(AVX2_ONLY, "avx512")
    assert isa is None and why == "the CPU lacks avx512f avx512bw avx512vl avx512dq avx512_vnni"
    isa, why = cpu(AVX2_ONLY, "sse")
    assert isa is None and why == "AGENTLANG_NATIVE must be 0, 1 or one of avx512, avx2, got 'sse'"


def test_a_cpu_without_avx2_keeps_the_torch_kernels(cpu):
    isa, why = cpu(frozenset({"sse4_2", "f16c"}))
    assert isa is None
    assert why == "the CPU lacks avx512f avx512bw avx512vl avx512dq avx512_vnni; or avx2 fma"
    assert cpu(frozenset())[1] == "no /proc/cpuinfo"


def test_each_build_has_its_own_sources_and_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for isa in native.ISAS:
        own = [*native.OWN, *isa.headers]
        assert bool({"kquant.h", "kgroups.h"} & set(isa.headers)) == isa.kquants   # K-quant readers
        assert [p.name for p in isa.sources()][-len(own):] == own
        assert all(p.parent.name == isa.name for p in isa.sources()[-len(own):])
        assert all(p.exists() for p in isa.sources())
    runnable = native.runnable_isas()
    if not runnable:
        pytest.skip("no native build runs on this CPU")
    paths = {native.build_library(i).path for i in runnable}
    assert len(paths) == len(runnable) and all(str(p).startswith(str(tmp_path)) for p in paths)


def test_avx2_and_avx512_builds_agree_where_both_run():
    gguf = pytest.importorskip("gguf")
    from agentlang.runtime.weights.gguf_weights import block_linear

    runnable = native.runnable_isas()
    if len(runnable) < 2:
        pytest.skip(f"needs both builds; this CPU runs {[i.name for i in runnable]}")
    torch.manual_seed(0)
    x = torch.randn(9, 576)
    for qtype in ("Q4_0", "Q4_1", "Q8_0"):
        raw = gguf.quants.quantize(torch.randn(70, 576).numpy(), gguf.GGMLQuantizationType[qtype])
        a, b = (block_linear(native.build_library(i), [(raw, qtype)]) for i in runnable)
        assert torch.equal(a.dequantize(), b.dequantize())
        ya, yb = a(x), b(x)                    # the same integer sums, float32 sums in another order
        assert ((ya - yb).norm() / ya.norm()).item() < 1e-6
        assert torch.equal(a.lib.dequantize_bf16(a.qweight), b.lib.dequantize_bf16(b.qweight))


def test_both_builds_multiply_k_quants_alike_where_both_run():
    """The same exact block sums, scaled by the same float32 steps: the results differ only in
    the order of float32 sums (every kind, few rows and many, a chain of kinds)."""
    pytest.importorskip("gguf")
    from agentlang.runtime.quant.kblock_linear import ChainLinear, KBlockLinear
    from agentlang.runtime.quant.kquant import split_kblocks
    from tests.support.gguf_files import random_blocks

    runnable = [i for i in native.runnable_isas() if i.kquants]
    if len(runnable) < 2:
        pytest.skip(f"needs both builds; this CPU runs {[i.name for i in runnable]}")
    libs = [native.build_library(i) for i in runnable]
    torch.manual_seed(0)
    for qtype in ("Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"):
        for K in ((576, 768) if qtype.endswith("_0") or qtype.endswith("_1") else (256, 1024)):
            raw = random_blocks(qtype, 45, K, seed=K)
            a, b = (KBlockLinear(lib, split_kblocks(raw, qtype)) for lib in libs)
            for T in (1, 3, 30):
                x = torch.randn(T, K)
                ya, yb = a(x), b(x)
                assert ((ya - yb).norm() / ya.norm()).item() < 1e-6, (qtype, K, T)
    raws = [random_blocks("Q4_K", 40, 512, 1), random_blocks("Q6_K", 24, 512, 2)]
    x = torch.randn(7, 512)
    ya, yb = (ChainLinear(lib, [KBlockLinear(lib, split_kblocks(r, t)) for r, t in
                                zip(raws, ("Q4_K", "Q6_K"))])(x) for lib in libs)
    assert ya.shape == (7, 64) and ((ya - yb).norm() / ya.norm()).item() < 1e-6
