"""Decode attention read straight from the paged pool (``paged_attention.c``) against a float64
reference, its row invariance, its errors, and the torch backend's use of it."""

import pytest
import torch

from agentlang.runtime.attention import torch_backend
from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.attention.torch_backend import TorchAttentionBackend
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.kernels import extend_attention_ref


def pool_tensors(P, S, Hkv, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(P, S, Hkv, D, generator=g).to(dtype),
            torch.randn(P, S, Hkv, D, generator=g).to(dtype))


def filled_pool(PS, HKV, D, dtype, seed, num_pages=96):
    """A one-layer pool of random K/V in every slot, and the generator that filled it."""
    pool = KVPool(KVLayout(1, HKV, D, dtype), PS, num_pages=num_pages)
    g = torch.Generator().manual_seed(seed)
    slots = torch.arange(num_pages * PS)
    pool.store(0, slots, torch.randn(slots.numel(), HKV, D, generator=g),
               torch.randn(slots.numel(), HKV, D, generator=g))
    return pool, g


def reference(q, k, v, pages, lens, scale):
    """float64 out [B, Hq, D] and lse [B, Hq]."""
    B, Hq, D = q.shape
    G = Hq // k.shape[2]
    outs, lses = [], []
    for b in range(B):
        kk = k[pages[b]].reshape(-1, k.shape[2], D)[: lens[b]].double().repeat_interleave(G, 1)
        vv = v[pages[b]].reshape(-1, k.shape[2], D)[: lens[b]].double().repeat_interleave(G, 1)
        s = torch.einsum("hd,thd->ht", q[b].double(), kk) * scale
        outs.append(torch.einsum("ht,thd->hd", s.softmax(-1), vv))
        lses.append(torch.logsumexp(s, -1))
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("S,Hkv,G,D", [(16, 3, 3, 64), (1, 2, 4, 128), (4, 1, 1, 256),
                                       (16, 2, 2, 48), (3, 4, 2, 32)])
def test_paged_decode_against_float64(native_lib, dtype, S, Hkv, G, D):
    """Head dims on the register path (64 / 128 / 256 on AVX-512; 32 / 64 / 128 on AVX2) and
    off it (48), page sizes 1..16, GQA groups 1..4, a row of one key and a row filling all
    its pages."""
    P, n_pages = 64, 12
    k, v = pool_tensors(P, S, Hkv, D, dtype, seed=D + S)
    g = torch.Generator().manual_seed(7)
    lens = torch.tensor([1, 5, n_pages * S, 2 * S + 1, 7 * S - 3])
    pages = torch.stack([torch.randperm(P, generator=g)[:n_pages] for _ in lens])
    q = torch.randn(len(lens), Hkv * G, D, generator=g).to(dtype)
    out, lse = native_lib.paged_decode(q, k, v, pages, lens, D ** -0.5)
    ref, ref_lse = reference(q, k, v, pages, lens, D ** -0.5)
    assert out.dtype == dtype and out.shape == q.shape and lse.shape == (len(lens), Hkv * G)
    tol = 2e-6 if dtype == torch.float32 else 8e-3          # bf16: the output's rounding
    assert (out.double() - ref).abs().max().item() < tol * max(1.0, ref.abs().max().item())
    assert (lse.double() - ref_lse).abs().max().item() < 1e-5 * ref_lse.abs().max().item() + 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_result_does_not_depend_on_the_batch(native_lib, dtype):
    """Each row alone gives the bits it gets among others (the invariance the engine's greedy
    outputs rest on); bf16 runs the vdpbf16ps scores where the CPU has them."""
    k, v = pool_tensors(40, 16, 3, 64, dtype, seed=1)
    g = torch.Generator().manual_seed(2)
    lens = torch.tensor([300, 17, 64, 1, 150])
    pages = torch.stack([torch.randperm(40, generator=g)[:20] for _ in lens])
    q = torch.randn(len(lens), 9, 64, generator=g).to(dtype)
    out, lse = native_lib.paged_decode(q, k, v, pages, lens, 0.125)
    for b in range(len(lens)):
        o1, l1 = native_lib.paged_decode(q[b:b + 1], k, v, pages[b:b + 1], lens[b:b + 1], 0.125)
        assert torch.equal(o1[0], out[b]) and torch.equal(l1[0], lse[b])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_page_size_does_not_change_a_bit(native_lib, dtype):
    """The same 203 keys in pages of 16, 4 and 1 (blocks of 16 keys cut differently): the same
    bits out."""
    g = torch.Generator().manual_seed(9)
    keys, vals = (torch.randn(208, 2, 64, generator=g).to(dtype) for _ in range(2))   # [T, Hkv, D]
    q = torch.randn(1, 6, 64, generator=g).to(dtype)
    outs = []
    for S in (16, 4, 1):
        n = 208 // S
        order = torch.randperm(n, generator=g)                  # page i holds block order[i]
        k, v = torch.empty(n, S, 2, 64, dtype=dtype), torch.empty(n, S, 2, 64, dtype=dtype)
        k[order], v[order] = keys.view(n, S, 2, 64), vals.view(n, S, 2, 64)
        outs.append(native_lib.paged_decode(q, k, v, order[None], torch.tensor([203]), 0.125))
    for o, l in outs[1:]:
        assert torch.equal(o, outs[0][0]) and torch.equal(l, outs[0][1])


def test_paged_decode_rejects_what_it_cannot_take(native_lib):
    k, v = pool_tensors(8, 4, 2, 64, torch.float32, seed=3)
    q = torch.randn(2, 4, 64)
    pages = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"lens must be in 1\.\.12"):
        native_lib.paged_decode(q, k, v, pages, torch.tensor([13, 4]), 1.0)
    with pytest.raises(ValueError, match=r"lens must be in 1\.\.12"):
        native_lib.paged_decode(q, k, v, pages, torch.tensor([0, 4]), 1.0)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        native_lib.paged_decode(q.half(), k, v, pages, torch.tensor([3, 4]), 1.0)
    with pytest.raises(ValueError, match="int64"):
        native_lib.paged_decode(q, k, v, pages.int(), torch.tensor([3, 4]), 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_decode_with_and_without_the_native_kernel(monkeypatch, dtype):
    """The torch backend's decode (a cascade group sharing 6 pages + a lone row) through the
    native kernel and through torch's gathers: both match the reference; the native one is
    used where the library runs."""
    PS, HKV, HQ, D = 4, 2, 6, 64
    pool, g = filled_pool(PS, HKV, D, dtype, seed=0)
    shared = list(range(1, 7))
    tables = [shared + [30 + 3 * i, 31 + 3 * i, 32 + 3 * i] for i in range(4)] + [[60, 61, 62]]
    prefix = [26, 29, 31, 25, 9]
    q = torch.randn(5, HQ, D, generator=g).to(dtype)
    calls = []
    lib = torch_backend.qmatmul_library()

    def spy():
        calls.append(1)
        return lib
    results = {}
    for native in (True, False):
        monkeypatch.setattr(torch_backend, "qmatmul_library", spy if native else lambda: None)
        batch = build_forward_batch([[1]] * 5, prefix, tables, PS)
        results[native] = TorchAttentionBackend().attend(q, pool, 0, batch, 0.125)
    k, v = pool.gather_kv(0, torch.arange(96))
    ref = extend_attention_ref(q, k, v, batch.page_table, batch.q_start_loc, batch.prefix_lens,
                               batch.seq_lens, 0.125)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    for out in results.values():
        assert ((out.double() - ref).norm() / ref.norm()).item() < tol
    assert calls, "the native kernel was not asked for"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_merge_equals_the_torch_merge(native_lib, dtype):
    """merge_lse_ (in place, o2 / l2 in one matmul's [H, M, ...] layout) against
    cascade.merge_lse: float32 to rounding, bf16 within one bf16 step."""
    from agentlang.runtime.attention.cascade import merge_lse

    M, H, G, D = 5, 3, 3, 40
    g = torch.Generator().manual_seed(3)
    o1 = torch.randn(M, H, G, D, generator=g).to(dtype)
    l1 = torch.randn(M, H, G, generator=g) * 4
    o2 = torch.randn(H, M, G, D, generator=g).to(dtype).transpose(0, 1)
    l2 = (torch.randn(H, M, G, generator=g) * 4).transpose(0, 1)
    ref = merge_lse(o1, l1, o2, l2)
    got = native_lib.merge_lse_(o1.clone(), l1, o2, l2)
    tol = 1e-6 if dtype == torch.float32 else 2 ** -7
    assert ((got.double() - ref.double()).abs() <= tol * ref.double().abs().clamp(min=1)).all()
    with pytest.raises(ValueError, match="merge_lse_"):
        native_lib.merge_lse_(o1.clone(), l1, o2.contiguous(), l2)   # o2 not stored [H, M, ...]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["all rows, a run", "some rows, a run", "all rows, scattered"])
def test_cascade_decode_through_the_native_kernel(monkeypatch, dtype, layout):
    """A decode step whose rows share leading pages, attended as a cascade (the group's part
    once, merged natively in place where the group is every row, through the row gathers
    otherwise; a run of consecutive shared pages read as a view of the pool) against the
    float64 reference."""
    from agentlang.runtime.attention import decode_plan

    monkeypatch.setattr(decode_plan, "CASCADE_MIN_KEYS", {})            # any group cascades
    PS, HKV, HQ, D = 4, 2, 6, 64
    pool, g = filled_pool(PS, HKV, D, dtype, seed=1)
    shared = [5, 2, 9, 7, 11, 3] if "scattered" in layout else list(range(1, 7))
    tables = [shared + [30 + 3 * i, 31 + 3 * i, 32 + 3 * i] for i in range(4)]
    prefix = [26, 29, 31, 25]
    if "some" in layout:
        tables, prefix = tables + [[60, 61, 62]], prefix + [9]
    q = torch.randn(len(tables), HQ, D, generator=g).to(dtype)
    batch = build_forward_batch([[1]] * len(tables), prefix, tables, PS)
    plan = decode_plan.decode_plan(batch.page_table, batch.seq_lens_list, PS,
                                   decode_plan.cascade_min_keys(dtype, True))
    (group,) = plan.groups
    assert group.everyone == ("all" in layout)
    assert (group.first_page is None) == ("scattered" in layout)
    out = TorchAttentionBackend().attend(q, pool, 0, batch, 0.125)
    k, v = pool.gather_kv(0, torch.arange(96))
    ref = extend_attention_ref(q, k, v, batch.page_table, batch.q_start_loc, batch.prefix_lens,
                               batch.seq_lens, 0.125)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert ((out.double() - ref).norm() / ref.norm()).item() < tol
