"""The torch attention backend against the float64 reference, on steps whose sequences share
cached leading pages (cascade groups, extend and decode) mixed with ones that do not."""

import random

import pytest
import torch

from agentlang.kernels import extend_attention_ref
from agentlang.runtime.attention import cascade, decode_plan, torch_backend
from agentlang.runtime.attention.torch_backend import TorchAttentionBackend
from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool

PS, HKV, HQ, D = 4, 2, 6, 16


def filled_pool(dtype=torch.float32, num_pages=96):
    pool = KVPool(KVLayout(1, HKV, D, dtype), PS, num_pages=num_pages)
    g = torch.Generator().manual_seed(0)
    slots = torch.arange(num_pages * PS)
    pool.store(0, slots, torch.randn(slots.numel(), HKV, D, generator=g),
               torch.randn(slots.numel(), HKV, D, generator=g))
    return pool


def attend(pool, new_lens, prefix_lens, tables, q):
    batch = build_forward_batch([[1] * n for n in new_lens], prefix_lens, tables, PS)
    out = TorchAttentionBackend().attend(q, pool, 0, batch, 0.25)
    k, v = pool.gather_kv(0, torch.arange(pool.num_pages))
    ref = extend_attention_ref(q, k, v, batch.page_table, batch.q_start_loc, batch.prefix_lens,
                               batch.seq_lens, 0.25)
    return out, ref, batch


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("causal_block,native", [(128, True), (128, False), (3, False)])
def test_extend_groups_match_the_reference(monkeypatch, causal_block, native):
    """Two groups sharing 3 and 5 cached pages (members of different new/own lengths, so
    several buckets), a sequence sharing pages with none, a fresh one and two decodes; the
    ungrouped ones as decode rows of the native kernel, or in torch's causal blocks (one
    block, or blocks of 3 queries)."""
    monkeypatch.setattr(cascade, "CAUSAL_BLOCK", causal_block)
    monkeypatch.setattr(decode_plan, "CASCADE_MIN_KEYS", {})    # every group pays here
    if not native:
        monkeypatch.setattr(torch_backend, "qmatmul_library", lambda: None)
    rng = random.Random(1)
    free = list(range(20, 96))
    rng.shuffle(free)
    shared_a, shared_b = [1, 2, 3], [4, 5, 6, 7, 8]

    def table(shared, n_tokens):
        own = -(-n_tokens // PS) - len(shared)
        return shared + [free.pop() for _ in range(own)]

    rows = [  # (new tokens, cached prefix, shared pages)
        (5, 12, shared_a), (5, 12, shared_a), (3, 14, shared_a), (7, 12, shared_a),
        (4, 20, shared_b), (6, 23, shared_b),
        (9, 10, []), (8, 0, []), (1, 13, shared_a), (1, 30, []),
    ]
    tables = [table(s, n + p) for n, p, s in rows]
    q = torch.randn(sum(n for n, _, _ in rows), HQ, D, generator=torch.Generator().manual_seed(2))
    out, ref, batch = attend(filled_pool(), [r[0] for r in rows], [r[1] for r in rows], tables, q)
    assert rel(out, ref) < 1e-6
    groups = batch.memo["torch.extend_groups"]
    assert sorted(sorted(g.rows) for g in groups) == [[0, 1, 2, 3], [4, 5]]
    short = batch.memo.get("torch.short_extends")
    if native and torch_backend.qmatmul_library() is not None:
        assert short.members == {6, 7}         # the two decodes run as a decode batch
    else:
        assert short is None
    assert [len(g.buckets) for g in sorted(groups, key=lambda g: g.rows[0])] == [3, 2]


def test_extend_group_chunks_its_queries(monkeypatch):
    """A group larger than one shared-part matmul: the same result chunked as in one piece."""
    shared = list(range(1, 9))
    tables = [shared + [40 + 2 * i, 41 + 2 * i] for i in range(12)]
    q = torch.randn(12 * 6, HQ, D, generator=torch.Generator().manual_seed(3))
    pool = filled_pool()
    whole, ref, _ = attend(pool, [6] * 12, [33] * 12, tables, q)
    monkeypatch.setattr(cascade, "MAX_QUERY_TOKENS", 12)
    chunked, _, _ = attend(pool, [6] * 12, [33] * 12, tables, q)
    assert rel(whole, ref) < 1e-6 and rel(chunked, ref) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_cascade_matches_the_reference(monkeypatch, dtype):
    monkeypatch.setattr(decode_plan, "CASCADE_MIN_KEYS", {})    # every group pays here
    shared = list(range(1, 7))
    lens = [26, 29, 31, 25]
    tables = [shared + [30 + 3 * i, 31 + 3 * i, 32 + 3 * i] for i in range(4)] + [[60, 61, 62]]
    q = torch.randn(5, HQ, D, generator=torch.Generator().manual_seed(4)).to(dtype)
    out, ref, batch = attend(filled_pool(dtype), [1] * 5, lens + [9], tables, q)
    assert rel(out, ref) < (1e-6 if dtype == torch.float32 else 1e-2)
    assert len(batch.memo["torch.decode"].groups) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,L", [(3, 1), (5, 37), (70, 1024)])
def test_native_softmax_with_lse_against_float64(native_lib, dtype, rows, L):
    lib = native_lib
    g = torch.Generator().manual_seed(rows * L)
    s = (torch.randn(rows, L, generator=g) * 4).to(dtype)
    if L > 1:
        s[:, torch.randperm(L, generator=g)[: L // 3]] = float("-inf")   # masked keys
        s[:, 0] = 0.5                                                    # a finite score a row
    ref = s.double() * 0.3
    p_ref, lse_ref = torch.softmax(ref, -1), torch.logsumexp(ref, -1)
    p = s.clone()
    lse = lib.softmax_lse_(p, 0.3)
    assert p.dtype == dtype and lse.shape == (rows,) and lse.dtype == torch.float32
    tol = 1e-6 if dtype == torch.float32 else 4e-3                       # bf16 rounds p
    assert ((p.double() - p_ref).abs() <= tol * p_ref + 1e-9).all()
    assert (p[s == float("-inf")] == 0).all()
    assert (lse.double() - lse_ref).abs().max().item() < 1e-5
    with pytest.raises(ValueError, match="contiguous float32 or bfloat16"):
        lib.softmax_lse_(torch.zeros(4, 8).t(), 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lead,n,G,L", [((), 1, 1, 1), ((3,), 5, 3, 5), ((2, 3), 37, 3, 300),
                                        ((3,), 128, 2, 200)])
def test_the_causal_softmax_is_the_masked_one_bit_for_bit(native_lib, dtype, lead, n, G, L):
    """The native softmax under a CausalTail (hidden keys neither masked nor read) gives the
    bits of the same scores masked to -inf by the tensor mask, leading dims and all; a shape
    the block cannot be is refused."""
    g = torch.Generator().manual_seed(n * L)
    s = (torch.randn(*lead, n * G, L, generator=g) * 4).to(dtype)
    tail = cascade.CausalTail(n, G)
    masked = s.clone()
    masked[..., L - n:].masked_fill_(tail.mask, float("-inf"))
    want_lse = native_lib.softmax_lse_(masked, 0.3)
    got = s.clone()
    got_lse = native_lib.softmax_lse_(got, 0.3, (n, G))
    assert torch.equal(got, masked) and torch.equal(got_lse, want_lse)
    with pytest.raises(ValueError, match="causal"):
        native_lib.softmax_lse_(s.clone(), 0.3, (n + 1, G))


def test_causal_blocks_shrink_past_block_keys(monkeypatch):
    """Blocks of CAUSAL_BLOCK queries while they see at most BLOCK_KEYS keys, then of
    LONG_CAUSAL_BLOCK: either way each token attends to exactly the keys up to its own
    (float64 reference), after a cached context and without one."""
    monkeypatch.setattr(cascade, "CAUSAL_BLOCK", 8)
    monkeypatch.setattr(cascade, "LONG_CAUSAL_BLOCK", 3)
    monkeypatch.setattr(cascade, "BLOCK_KEYS", 20)
    g = torch.Generator().manual_seed(11)
    for start, n in ((0, 30), (13, 17), (25, 5)):
        q = torch.randn(n, 6, 16, generator=g)
        k, v = (torch.randn(start + n, 2, 16, generator=g) for _ in range(2))
        out = cascade.causal_attend(q, k, v, start, 0.25)
        kk, vv = (t.double().repeat_interleave(3, 1) for t in (k, v))       # [L, 6, 16]
        s = torch.einsum("thd,lhd->htl", q.double(), kk) * 0.25
        hidden = torch.arange(start + n)[None, :] > (start + torch.arange(n))[:, None]
        ref = torch.einsum("htl,lhd->thd", s.masked_fill(hidden, float("-inf")).softmax(-1), vv)
        assert (out.double() - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_under_a_causal_tail_is_the_masked_attention(dtype):
    """attend_lse with a CausalTail (bf16: the native causal softmax; float32 prefill-sized
    rows: oneDNN per head) gives the bits it gives with the tail's tensor mask."""
    g = torch.Generator().manual_seed(5)
    n, G, L = 40, 3, 90
    q = torch.randn(3, n * G, 64, generator=g).to(dtype)
    k, v = (torch.randn(L, 3, 64, generator=g).to(dtype) for _ in range(2))
    tail = cascade.CausalTail(n, G)
    o1, l1 = cascade.attend_lse(q, k, v, 0.125, tail)
    o2, l2 = cascade.attend_lse(q, k, v, 0.125, tail.mask)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_short_extend_gives_each_token_its_one_token_decode(dtype):
    """A 6-token extend (a draft being verified) beside a long prefill: each of its tokens gets
    bit for bit the attention a decode step at that position gives; the long one takes torch's
    causal blocks and still matches the reference."""
    if torch_backend.qmatmul_library() is None:
        pytest.skip("the native library does not run on this CPU")
    pool = filled_pool(dtype)
    q = torch.randn(6 + 80, HQ, D, generator=torch.Generator().manual_seed(5)).to(dtype)
    short_table, long_table = list(range(1, 5)), list(range(10, 31))
    out, ref, batch = attend(pool, [6, 80], [9, 0], [short_table, long_table], q)
    assert batch.memo["torch.short_extends"].members == {0}
    assert rel(out, ref) < (1e-6 if dtype == torch.float32 else 1e-2)
    for j in range(6):
        one, _, _ = attend(pool, [1], [9 + j], [short_table], q[j:j + 1])
        assert torch.equal(out[j], one[0]), f"token {j}"


def test_worth_rows_keeps_long_contexts_on_the_matmul_path():
    assert torch_backend.worth_rows(16, 80) and torch_backend.worth_rows(2, 1024)
    assert not torch_backend.worth_rows(33, 1024) and not torch_backend.worth_rows(64, 600)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_group_too_small_to_pay_runs_as_rows(monkeypatch, dtype):
    """Where the native kernel reads pages in place, a shared prefix too short (or shared by
    too few) for a cascade to pay is read by each row; enough shared keys make the group.
    Both match the reference."""
    if torch_backend.qmatmul_library() is None:
        pytest.skip("the native library does not run on this CPU")
    shared = list(range(1, 7))                                   # 24 shared keys
    tables = [shared + [30 + 3 * i, 31 + 3 * i, 32 + 3 * i] for i in range(4)]
    q = torch.randn(4, HQ, D, generator=torch.Generator().manual_seed(6)).to(dtype)
    pool = filled_pool(dtype)
    for limit, groups in ((4 * 24 + 1, 0), (4 * 24, 1)):
        monkeypatch.setattr(decode_plan, "CASCADE_MIN_KEYS", {dtype: limit})
        out, ref, batch = attend(pool, [1] * 4, [26, 29, 31, 25], tables, q)
        assert len(batch.memo["torch.decode"].groups) == groups
        assert rel(out, ref) < (1e-6 if dtype == torch.float32 else 1e-2)
    assert decode_plan.cascade_min_keys(dtype, native=False) == 0   # torch's buckets: always


def test_a_prefills_slot_runs_are_stored_as_slices_with_the_same_result():
    """store_kv's runs of consecutive slots (a prefill's) write what the pool's indexed store
    writes; scattered slots (more runs than MAX_STORE_RUNS) take that store."""
    assert torch_backend.slot_runs([8, 9, 10, 40, 41, 3]) == [(0, 8, 3), (3, 40, 2), (5, 3, 1)]
    assert torch_backend.slot_runs(list(range(0, 2 * (torch_backend.MAX_STORE_RUNS + 1), 2))) is None
    tables = [[5, 6, 7], [20, 21], [60, 2, 3]]                  # the last: not consecutive pages
    batch = build_forward_batch([[1] * 10, [1] * 7, [1] * 9], [0, 0, 0], tables, PS)
    g = torch.Generator().manual_seed(4)
    k, v = torch.randn(26, HKV, D, generator=g), torch.randn(26, HKV, D, generator=g)
    runs, indexed = filled_pool(), filled_pool()
    TorchAttentionBackend().store_kv(runs, 0, k, v, batch)
    indexed.store(0, batch.slot_mapping, k, v)
    assert batch.memo["torch.slot_runs"] is not None
    assert torch.equal(runs.buffer, indexed.buffer)


def test_a_bf16_extend_groups_shared_part_in_one_call_per_bucket(monkeypatch):
    """bf16 at head dim 64 (the AMX tiles where they run): a group larger than one chunk takes
    its shared part for every member at once and merges each chunk with its rows of it
    (merge_lse_ over the first rows of a larger result); the same as the reference either way,
    and the native merge of such rows equals the torch merge."""
    S, hkv, hq, d = 16, 3, 9, 64
    pool = KVPool(KVLayout(1, hkv, d, torch.bfloat16), S, num_pages=64)
    g = torch.Generator().manual_seed(5)
    slots = torch.arange(64 * S)
    pool.store(0, slots, torch.randn(slots.numel(), hkv, d, generator=g),
               torch.randn(slots.numel(), hkv, d, generator=g))
    shared = list(range(8))
    tables = [shared + [20 + 2 * i, 21 + 2 * i] for i in range(10)]
    q = torch.randn(10 * 6, hq, d, generator=g).bfloat16()
    monkeypatch.setattr(decode_plan, "CASCADE_MIN_KEYS", {})
    monkeypatch.setattr(cascade, "MAX_QUERY_TOKENS", 12)                 # chunks of 2 members
    batch = build_forward_batch([[1] * 6] * 10, [8 * S + 3] * 10, tables, S)
    out = TorchAttentionBackend().attend(q, pool, 0, batch, 0.125)
    k, v = pool.gather_kv(0, torch.arange(64))
    ref = extend_attention_ref(q, k, v, batch.page_table, batch.q_start_loc, batch.prefix_lens,
                               batch.seq_lens, 0.125)
    assert len(batch.memo["torch.extend_groups"]) == 1 and rel(out, ref) < 1e-2
    lib = torch_backend.qmatmul_library()
    if lib is not None:
        o2, l2 = cascade.attend_shared(torch.randn(5, hkv, 4, d, generator=g).bfloat16(),
                                       k.flatten(0, 1)[:100], v.flatten(0, 1)[:100], 0.125)
        o1 = torch.randn(2, hkv, 4, d, generator=g).bfloat16()
        l1 = torch.randn(2, hkv, 4, generator=g)
        assert lib.mergeable(o1, l1, o2[1:3], l2[1:3])
        assert torch.equal(lib.merge_lse_(o1.clone(), l1, o2[1:3], l2[1:3]),
                           cascade.merged(o1.clone(), l1, o2[1:3], l2[1:3]))
        want = cascade.merge_lse(o1, l1, o2[1:3], l2[1:3]).float()
        got = lib.merge_lse_(o1.clone(), l1, o2[1:3], l2[1:3]).float()
        assert (got - want).abs().max().item() <= 2 ** -7 * want.abs().max().item()


def test_bf16_rows_attend_a_float32_prefills_causal_blocks_in_bf16():
    """``TorchAttentionBackend(bf16_rows)`` (a float32 model whose large calls are bf16
    GEMMs): a step of that many tokens or more attends its sequences' causal blocks with q and
    K/V rounded to bf16 (the reference's bf16 precision, not the float32 bits); a smaller step
    keeps the float32 path bit for bit."""
    pool = filled_pool(torch.float32)
    g = torch.Generator().manual_seed(9)
    q = torch.randn(80, HQ, D, generator=g)
    table = list(range(10, 31))
    batch = build_forward_batch([[1] * 80], [0], [table], PS)
    exact = TorchAttentionBackend().attend(q, pool, 0, batch, 0.25)
    k, v = pool.gather_kv(0, torch.arange(pool.num_pages))
    ref = extend_attention_ref(q.double(), k.double(), v.double(), batch.page_table,
                               batch.q_start_loc, batch.prefix_lens, batch.seq_lens, 0.25)
    out = TorchAttentionBackend(bf16_rows=64).attend(q, pool, 0, batch, 0.25)
    assert out.dtype == torch.float32 and not torch.equal(out, exact)
    assert rel(out, ref) < 1e-2 and rel(exact, ref) < 1e-6
    kk, vv = cascade.kv_of(pool, 0, batch.page_table[0], 80, torch.bfloat16)
    assert torch.equal(out, cascade.causal_attend(q.bfloat16(), kk, vv, 0, 0.25).float())
    assert torch.equal(TorchAttentionBackend(bf16_rows=81).attend(q, pool, 0, batch, 0.25), exact)


@pytest.mark.parametrize("native", [True, False])
def test_a_bfloat16_storing_pool_reads_as_its_values_in_float32(monkeypatch, native):
    """A float32 model's pool storing bfloat16 (``kv_dtype="bfloat16"``): every path of the
    backend (decode rows, a decode cascade, extend groups, short extends, causal blocks, a
    sliding window with capped scores) gives bit for bit what a float32 pool holding the same
    rounded values gives; with and without the native kernels."""
    monkeypatch.setattr(decode_plan, "CASCADE_MIN_KEYS", {})    # every group pays here
    if not native:
        monkeypatch.setattr(torch_backend, "qmatmul_library", lambda: None)
    narrow = KVPool(KVLayout(1, HKV, D, torch.float32, "bfloat16"), PS, num_pages=96)
    wide = filled_pool()
    slots = torch.arange(96 * PS)
    k, v = wide.gather_kv(0, torch.arange(96))
    k, v = k.flatten(0, 1).to(torch.bfloat16).float(), v.flatten(0, 1).to(torch.bfloat16).float()
    wide.store(0, slots, k, v)
    narrow.store(0, slots, k, v)
    assert narrow.buffer.dtype == torch.bfloat16
    shared = list(range(1, 7))
    g = torch.Generator().manual_seed(5)
    steps = [  # (new tokens, cached prefixes, tables)
        ([1] * 5, [26, 29, 31, 25, 9],
         [shared + [30 + 3 * i, 31 + 3 * i, 32 + 3 * i] for i in range(4)] + [[60, 61, 62]]),
        ([5, 3, 9, 8, 1], [12, 14, 10, 0, 13],
         [shared[:3] + [40, 41], shared[:3] + [42, 43], [44, 45, 46, 47, 48], [49, 50],
          shared[:3] + [51]]),
    ]
    for new, prefix, tables in steps:
        q = torch.randn(sum(new), HQ, D, generator=g)
        batch = build_forward_batch([[1] * n for n in new], prefix, tables, PS)
        outs = [TorchAttentionBackend().attend(q, pool, 0, batch, 0.25) for pool in (narrow, wide)]
        assert torch.equal(*outs)
        outs = [TorchAttentionBackend().attend(q, pool, 0, batch, 0.25, window=7, softcap=30.0)
                for pool in (narrow, wide)]
        assert torch.equal(*outs)
