"""Which build of the native library runs (``runtime/quant/native/__init__.py``): the best the
CPU's flags allow, ``AGENTLANG_NATIVE`` choosing one or none, a clear reason otherwise; and the
AVX2 and AVX-512 builds computing the same products where both run."""

import pytest
import torch

import agentlang.runtime.quant.native as native

AVX2_ONLY = frozenset({"avx2", "fma", "f16c", "sse4_2"})
AVX512 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
AMX = AVX512 | {"amx_tile", "amx_int8", "amx_bf16"}


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
    assert cpu(AMX)[0].name == "amx"
    assert [i.name for i in native.runnable_isas()] == ["amx", "avx512", "avx2"]
    assert cpu(AVX512)[0].name == "avx512"
    assert cpu(AVX2_ONLY)[0].name == "avx2"
    assert cpu(AVX512, "1")[0].name == "avx512"
    assert [i.name for i in native.runnable_isas()] == ["avx512", "avx2"]
    cpu(AVX2_ONLY)
    assert [i.name for i in native.runnable_isas()] == ["avx2"]


def test_agentlang_native_picks_a_build_or_none(cpu):
    assert cpu(AVX512, "avx2") == (native.ISAS[2], None)             # AVX-512 runs AVX2 too
    assert cpu(AMX, "avx512") == (native.ISAS[1], None)              # AMX runs AVX-512 too
    assert native.chosen_isa(after=native.ISAS[0]) == (native.ISAS[1], None)  # AMX refused
    assert cpu(AVX512, "0") == (None, "AGENTLANG_NATIVE=0")
    isa, why = cpu(AVX2_ONLY, "avx512")
    assert isa is None and why == "the CPU lacks avx512f avx512bw avx512vl avx512dq avx512_vnni"
    isa, why = cpu(AVX2_ONLY, "sse")
    assert isa is None and why == "AGENTLANG_NATIVE must be 0, 1 or one of amx, avx512, avx2, got 'sse'"


def test_a_cpu_without_avx2_keeps_the_torch_kernels(cpu):
    isa, why = cpu(frozenset({"sse4_2", "f16c"}))
    assert isa is None
    assert why == ("the CPU lacks avx512f avx512bw avx512vl avx512dq avx512_vnni amx_tile "
                   "amx_int8; or avx512f avx512bw avx512vl avx512dq avx512_vnni; or avx2 fma")
    assert cpu(frozenset())[1] == "no /proc/cpuinfo"


def test_each_build_has_its_own_sources_and_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for isa in native.ISAS:
        own = [*native.OWN, *isa.headers]
        assert bool({"kquant.h", "kgroups.h"} & set(isa.headers)) == isa.kquants   # K-quant readers
        assert [p.name for p in isa.sources()][-len(own):] == own
        assert all(p.parent.name == (isa.folder or isa.name) for p in isa.sources()[-len(own):])
        assert all(p.exists() for p in isa.sources())
    runnable = native.runnable_isas()
    if not runnable:
        pytest.skip("no native build runs on this CPU")
    paths = {native.build_library(i).path for i in runnable}
    assert len(paths) == len(runnable) and all(str(p).startswith(str(tmp_path)) for p in paths)


def test_the_builds_agree_where_they_run():
    """Every build this CPU runs (the AMX one in its own panel layout) holds the same weights
    and gives the same products but for the order of float32 sums."""
    gguf = pytest.importorskip("gguf")
    from agentlang.runtime.weights.gguf_weights import block_linear

    runnable = native.runnable_isas()
    if len(runnable) < 2:
        pytest.skip(f"needs two builds; this CPU runs {[i.name for i in runnable]}")
    torch.manual_seed(0)
    x = torch.randn(9, 576)
    for qtype in ("Q4_0", "Q4_1", "Q8_0"):
        raw = gguf.quants.quantize(torch.randn(70, 576).numpy(), gguf.GGMLQuantizationType[qtype])
        a, *others = (block_linear(native.build_library(i), [(raw, qtype)]) for i in runnable)
        for b in others:
            assert torch.equal(a.dequantize(), b.dequantize())
            assert torch.equal(a.rows(torch.tensor([69, 3, 16])), b.rows(torch.tensor([69, 3, 16])))
            ya, yb = a(x), b(x)                # the same integer sums, float32 sums in another order
            assert ((ya - yb).norm() / ya.norm()).item() < 1e-6
            assert torch.equal(a.lib.dequantize_bf16(a.qweight), b.lib.dequantize_bf16(b.qweight))


def amx_build():
    isa = native.ISAS[0]
    if isa not in native.runnable_isas():
        pytest.skip("the CPU has no AMX tiles (amx_tile, amx_int8)")
    lib = native.build_library(isa)
    if not lib.amx_ready():
        pytest.skip("Linux refused the AMX tile permission")
    return lib


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_amx_tiles_and_the_one_row_path_give_the_same_bits(qtype):
    """A call of one row (VNNI, a weight row a lane), of a few (VNNI, the weights unpacked once
    for up to 6 rows) and of more (AMX tiles from 4 rows for Q8, 9 for Q4; up to 16 rows a tile,
    split evenly) give each row the same bits; and the float64 product of the exact weights."""
    gguf = pytest.importorskip("gguf")
    from agentlang.runtime.weights.gguf_weights import block_linear

    lib = amx_build()
    torch.manual_seed(1)
    for N, K in ((70, 576), (16, 1536), (5, 64)):
        raw = gguf.quants.quantize(torch.randn(N, K).numpy(), gguf.GGMLQuantizationType[qtype])
        lin = block_linear(lib, [(raw, qtype)], torch.randn(N))
        assert lin.qs.shape[0] == -(-N // 16)                    # panels of 16 rows
        x = torch.randn(37, K)
        y = lin(x)
        alone = torch.cat([lin(x[i:i + 1]) for i in range(37)])
        assert torch.equal(alone, y), (N, K)
        for T in (2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33):
            assert torch.equal(lin(x[:T]), y[:T]), (N, K, T)
        ref = x.double() @ lin.dequantize().double().T + lin.bias.double()
        assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-4


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
            a, *others = (KBlockLinear(lib, split_kblocks(raw, qtype)) for lib in libs)
            for T in (1, 3, 30):
                x = torch.randn(T, K)
                ya = a(x)
                for b in others:
                    yb = b(x)
                    assert ((ya - yb).norm() / ya.norm()).item() < 1e-6, (qtype, K, T)
    raws = [random_blocks("Q4_K", 40, 512, 1), random_blocks("Q6_K", 24, 512, 2)]
    x = torch.randn(7, 512)
    ya, *others = (ChainLinear(lib, [KBlockLinear(lib, split_kblocks(r, t)) for r, t in
                                     zip(raws, ("Q4_K", "Q6_K"))])(x) for lib in libs)
    assert ya.shape == (7, 64)
    assert all(((ya - yb).norm() / ya.norm()).item() < 1e-6 for yb in others)


def test_an_amx_chain_mixes_panel_parts_and_k_quant_parts():
    """A chain of a Q5_K part (qmatmul.c's layout) and Q4_K / Q8_0 / Q4_1 parts (panels): each
    part's columns are the part's own product, alone or chained, at any row count."""
    gguf = pytest.importorskip("gguf")
    from agentlang.runtime.quant.kblock_linear import ChainLinear, KBlockLinear
    from agentlang.runtime.quant.kquant import split_kblocks
    from agentlang.runtime.weights.gguf_weights import block_linear
    from tests.support.gguf_files import random_blocks

    lib = amx_build()
    torch.manual_seed(2)
    parts = [KBlockLinear(lib, split_kblocks(random_blocks(t, 40, 512, 1), t))
             for t in ("Q5_K", "Q4_K")]
    assert [p.panels for p in parts] == [False, True]
    for qtype, n in (("Q8_0", 24), ("Q4_1", 33)):
        raw = gguf.quants.quantize(torch.randn(n, 512).numpy(), gguf.GGMLQuantizationType[qtype])
        parts.append(block_linear(lib, [(raw, qtype)]))
    chain = ChainLinear(lib, parts)
    for T in (1, 3, 7, 20):
        x = torch.randn(T, 512)
        assert torch.equal(chain(x), torch.cat([p(x) for p in parts], dim=1)), T


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q5_0", "Q5_1"])
def test_amx_k_quant_panels_match_the_file_and_every_row_count(qtype):
    """Q4_K / Q6_K / Q5_0 / Q5_1 kept in panels: the same weights as the AVX-512 build's
    layout (rows, bf16 dequantization), the one-row path's bits at every row count, and the
    float64 product."""
    pytest.importorskip("gguf")
    from agentlang.runtime.quant.kblock_linear import KBlockLinear
    from agentlang.runtime.quant.kquant import split_kblocks
    from tests.support.gguf_files import random_blocks

    lib = amx_build()
    plain = native.build_library(native.ISAS[1])
    torch.manual_seed(3)
    shapes = [(40, 512), (21, 1024)] + ([(19, 576)] if qtype.startswith("Q5") else [])
    for N, K in shapes:                          # Q5: 64-weight multiples, 576 as in SmolLM2
        raw, bias = random_blocks(qtype, N, K, seed=N), torch.randn(N)
        lin, ref = (KBlockLinear(lb, split_kblocks(raw, qtype), bias) for lb in (lib, plain))
        assert lin.panels and not ref.panels
        ids = torch.tensor([N - 1, 0, 17])
        assert torch.equal(lin.rows(ids), ref.rows(ids))
        assert torch.equal(lin.dequantize(), ref.dequantize())
        assert torch.equal(lib.dequantize_bf16(lin.qweight), plain.dequantize_bf16(ref.qweight))
        x = torch.randn(21, K)
        y = lin(x)
        assert torch.equal(torch.cat([lin(x[i:i + 1]) for i in range(21)]), y)
        for T in (2, 3, 4, 5, 6, 7, 8, 9, 17):
            assert torch.equal(lin(x[:T]), y[:T]), (N, K, T)
        expected = x.double() @ lin.dequantize().double().T + lin.bias.double()
        assert ((y.double() - expected).norm() / expected.norm()).item() < 1e-4
        assert ((y - ref(x)).norm() / y.norm()).item() < 1e-6


def test_a_build_that_cannot_run_gives_way_to_the_next(cpu, monkeypatch, caplog):
    """The AMX build failing to compile, or Linux refusing its tiles, leaves the AVX-512 one;
    the last build failing leaves none, with the failure as the reason."""
    import subprocess

    class Lib:
        def __init__(self, isa):
            self.isa = isa

        def amx_ready(self):
            return False                                   # the tiles refused

    def build(isa):
        if isa.name == "avx2":
            raise subprocess.CalledProcessError(1, "cc", stderr="no compiler for this")
        return Lib(isa)

    monkeypatch.setattr(native, "build_library", build)
    cpu(AMX)
    assert native.qmatmul_library.__wrapped__().isa.name == "avx512"
    cpu(AVX2_ONLY)
    with caplog.at_level("INFO", logger=native.__name__):
        assert native.qmatmul_library.__wrapped__() is None
    assert "unavailable (build failed: no compiler for this)" in caplog.text


def test_zero_rows_give_an_empty_product_in_every_build():
    """A step whose sequences are all mid-prefill has no logits rows: the head multiplies 0
    rows. Every build and kind returns ``[0, N]`` (the AMX build's tile split divided by the
    row count: SIGFPE, the server gone)."""
    gguf = pytest.importorskip("gguf")
    from agentlang.runtime.quant.kblock_linear import KBlockLinear
    from agentlang.runtime.quant.kquant import split_kblocks
    from agentlang.runtime.weights.gguf_weights import block_linear
    from tests.support.gguf_files import random_blocks

    runnable = native.runnable_isas()
    if not runnable:
        pytest.skip("no native build runs on this CPU")
    torch.manual_seed(4)
    for isa in runnable:
        lib = native.build_library(isa)
        for qtype in ("Q4_0", "Q4_1", "Q8_0"):
            raw = gguf.quants.quantize(torch.randn(40, 512).numpy(),
                                       gguf.GGMLQuantizationType[qtype])
            lin = block_linear(lib, [(raw, qtype)], torch.randn(40))
            assert lin(torch.empty(0, 512)).shape == (0, 40), (isa.name, qtype)
            assert lin(torch.randn(3, 512)).shape == (3, 40)
        for qtype in (("Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1") if isa.kquants else ()):
            lin = KBlockLinear(lib, split_kblocks(random_blocks(qtype, 40, 512, 1), qtype))
            assert lin(torch.empty(0, 512)).shape == (0, 40), (isa.name, qtype)
