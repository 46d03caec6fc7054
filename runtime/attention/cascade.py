"""Attention in parts merged by log-sum-exp, and the cascade plan of an extend step.

Softmax attention over keys ``A ∪ B`` equals the attention over ``A`` and over ``B`` merged by
their log-sum-exps, so a part that many queries share (a common system prompt) can be attended
**once** for all of them, in one large matmul, and merged with each sequence's own part. The
decode path (:mod:`agentlang.runtime.attention.decode_plan`) and the extend path below both do this.

An extend step whose sequences share leading cached pages (``n`` requests with one system
prompt, each prefilling its own question) is planned once per step (:func:`extend_plan`): the
shared pages of each group, and its members bucketed by (new tokens, own context) so that each
bucket's own part is one batched matmul with one causal mask.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from agentlang.runtime.attention.decode_plan import shared_prefix_groups
from agentlang.runtime.attention import onednn
from agentlang.runtime.quant.native import qmatmul_library

MAX_QUERY_TOKENS = 512   # query tokens a shared-part matmul takes at a time (bounds its scores)
CAUSAL_BLOCK = 512       # query tokens a causal block (keys up to the block's last only) ...
LONG_CAUSAL_BLOCK = 128  # ... and once a block would see more than BLOCK_KEYS keys, these
BLOCK_KEYS = 4096        # (bounding its scores [Hkv, block * G, keys] over a long context)


@dataclass(frozen=True)
class CausalTail:
    """The causal mask of ``n`` new tokens over their own keys, the last ``n`` of the context,
    for query rows in (token, head) order, ``group`` heads a token: row ``i * group + g`` does
    not see key ``j > i`` of the last ``n``. :func:`attend_lse` applies it inside the native
    softmax without building it (the hidden scores are neither masked nor read); elsewhere
    :attr:`mask` is the bool tensor."""
    n: int
    group: int

    @functools.cached_property
    def mask(self) -> torch.Tensor:
        """bool [n * group, n], True where key j > token t (built once: a step's extend plan
        keeps its tails for every layer)."""
        above = torch.ones(self.n, self.n, dtype=torch.bool).triu_(1)             # [n, n]
        return above[:, None, :].expand(self.n, self.group, self.n).reshape(
            self.n * self.group, self.n)


Mask = torch.Tensor | CausalTail


def attend_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               masked: Mask | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention with its log-sum-exp.

    q: [..., H, R, D] (the R query rows of each KV head: its G query heads × tokens);
    k, v: [..., L, H, D] as gathered from the pool; masked: bool, True where a key is hidden,
    over the **last** ``t = masked.shape[-1] <= L`` keys (broadcastable to [..., H, R, t]; the
    keys before them are visible to every row), or None; no row may be masked entirely. A
    causal extend passes only its diagonal block (a :class:`CausalTail`), so the mask costs
    [R, n] whatever the cached context. The scores' matmul runs in q's
    dtype; scale, softmax and lse in float32 (natively where :mod:`agentlang.runtime.quant.native` runs: three
    passes over the scores, p written back in their dtype); float32 prefill-sized calls run per
    KV head through oneDNN (:mod:`agentlang.runtime.attention.onednn`). Returns out
    [..., H, R, D] in v's dtype and lse [..., H, R] float32. ``masked`` may be a
    :class:`CausalTail` (rows R = its n × group), which the native softmax applies unbuilt.
    """
    native = qmatmul_library() if q.device.type == "cpu" else None

    def normalize(s: torch.Tensor, hidden: Mask | None) -> torch.Tensor:
        """Scores [..., R, L] -> probabilities in place (the last keys ``hidden`` masked first,
        in s's dtype: adding a float32 bias to bf16 scores was slower than the matmuls);
        returns the log-sum-exp [..., R]."""
        fast = (native is not None and s.dtype in (torch.float32, torch.bfloat16)
                and s.is_contiguous())
        if isinstance(hidden, CausalTail):
            if fast:
                return native.softmax_lse_(s, scale, (hidden.n, hidden.group))
            hidden = hidden.mask
        if hidden is not None:
            s[..., s.shape[-1] - hidden.shape[-1]:].masked_fill_(hidden, float("-inf"))
        if fast:
            return native.softmax_lse_(s, scale)        # in s's dtype (3 passes)
        sf = s.float() if s.dtype != torch.float32 else s
        sf.mul_(scale)
        m = sf.amax(-1, keepdim=True)
        p = sf.sub_(m).exp_()
        z = p.sum(-1, keepdim=True)
        p.div_(z)
        if sf is not s:
            s.copy_(p)
        return (m + z.log_()).squeeze(-1)

    if onednn.applies(q):
        if isinstance(masked, CausalTail):       # the same mask for every head: one per call
            return onednn.attend(q, k, v, None, lambda s, _: normalize(s, masked))
        return onednn.attend(q, k, v, masked, normalize)
    s = torch.matmul(q, k.movedim(-3, -1))                               # [..., H, R, L]
    lse = normalize(s, masked)
    out = torch.matmul(s if s.dtype == v.dtype else s.to(v.dtype), v.movedim(-3, -2))
    return out, lse


def causal_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                  scale: float) -> torch.Tensor:
    """Causal attention of one sequence's new tokens at positions ``start..start+n-1``.

    q: [n, Hq, D]; k, v: [start + n, Hkv, D] (its whole context). Blocks of CAUSAL_BLOCK
    queries (LONG_CAUSAL_BLOCK past BLOCK_KEYS keys) each attend to the keys up to their last
    one, as one matmul per KV head (its G query heads as rows: GQA without expansion), the
    block's own keys under a :class:`CausalTail` (the softmax skips the hidden ones, so a
    large block wastes only the matmuls' upper triangle: bf16 prefill of 2048 tokens a step,
    prompts of 256 / 1024 tokens, ~1.1x / ~1.25x with blocks of 512 over 128). Returns
    [n, Hq, D] in v's dtype. On CPU this was ~2.4x torch's causal SDPA kernel at 1024 tokens
    (a 135M model's head shapes) with blocks of 128 on the first machine, 4x (float32) and 8x
    (bf16) on the AMX Xeon of 2026-12-07."""
    n, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    out = torch.empty(n, Hq, D, dtype=v.dtype)
    s = 0
    while s < n:
        size = CAUSAL_BLOCK if start + min(n, s + CAUSAL_BLOCK) <= BLOCK_KEYS \
            else min(CAUSAL_BLOCK, LONG_CAUSAL_BLOCK)
        e = min(n, s + size)
        keys = start + e                                             # L: keys this block sees
        if on_tiles(q[s:e].view(e - s, Hkv, G, D), k[:keys], v[:keys], scale, (e - s, G),
                    out[s:e].view(e - s, Hkv, G, D)) is None:   # the tiles: in place, as laid out
            qb = q[s:e].view(e - s, Hkv, G, D).permute(1, 0, 2, 3).reshape(Hkv, (e - s) * G, D)
            o, _ = attend_lse(qb, k[:keys], v[:keys], scale, CausalTail(e - s, G))  # [Hkv, b*G, D]
            out[s:e] = o.view(Hkv, e - s, G, D).permute(1, 0, 2, 3).reshape(e - s, Hq, D)
        s = e
    return out


def tiles_take(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether :func:`on_tiles` may run for these: bf16 on a CPU whose native build has AMX
    bf16 tiles, K/V with each key's heads contiguous (the kernel's own checks can still
    refuse, e.g. D other than 64 / 128)."""
    native = qmatmul_library() if q.device.type == "cpu" else None
    return (native is not None and q.dtype == k.dtype == v.dtype == torch.bfloat16
            and k.stride()[1:] == (q.shape[-1], 1) and v.stride() == k.stride())


def on_tiles(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
             causal: tuple[int, int] | None = None, out: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`attend_lse` of q [H, R, D] (or [T, H, G, D], tokens first, written into ``out``
    of that shape when given) over k, v [L, H, D] (``causal`` (n, G): under
    ``CausalTail(n, G)``) on AMX bf16 tiles (``shared_attention.c``: float32 scores, so the
    last bits differ from attend_lse's), or None where they do not run (:func:`tiles_take`,
    or the kernel refuses)."""
    if not tiles_take(q, k, v):
        return None
    return qmatmul_library().attend_shared_bf16(q.contiguous(), k, v, scale, causal, out)


def attend_shared(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence's queries against one shared K/V, as one matmul per KV head.

    q: [M, Hkv, R, D] (M sequences, R query rows each a KV head); k, v: [L, Hkv, D].
    Returns out [M, Hkv, R, D] and lse [M, Hkv, R], as :func:`attend_lse` per sequence
    (transposed views of [Hkv, M, R, ...] tensors). bf16 on a CPU with AMX bf16 tiles runs
    the native kernel (``shared_attention.c``: keys and values packed once, scores, softmax
    and values a 16-row tile at a time; float32 scores, so the last bits differ from
    :func:`attend_lse`'s): 64 rows x 3 heads over 1k keys, 0.73 -> 0.40 ms."""
    M, Hkv, R, D = q.shape
    rows = q.transpose(0, 1).reshape(Hkv, M * R, D)
    o, lse = on_tiles(rows, k, v, scale) or attend_lse(rows, k, v, scale)
    return o.view(Hkv, M, R, D).transpose(0, 1), lse.view(Hkv, M, R).transpose(0, 1)


def merge_lse(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor
              ) -> torch.Tensor:
    """The attention over both key sets from each one's (out [..., D], lse [...]); in o1's dtype."""
    mx = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - mx), torch.exp(l2 - mx)
    merged = o1.float() * w1[..., None] + o2.float() * w2[..., None]
    return (merged / (w1 + w2)[..., None]).to(o1.dtype)


def merged(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor
           ) -> torch.Tensor:
    """:func:`merge_lse` of o1 [M, H, R, D] (lse l1) with :func:`attend_shared`'s (o2, l2), or
    its first rows: in place on o1 by the native library (``merge_lse_``, one call) where it
    takes them (``QMatmulLibrary.mergeable``), else merge_lse's new tensor. Use the result,
    not o1."""
    native = qmatmul_library() if o1.device.type == "cpu" else None
    if native is not None and native.mergeable(o1, l1, o2, l2):
        return native.merge_lse_(o1, l1, o2, l2)
    return merge_lse(o1, l1, o2, l2)


@dataclass(frozen=True)
class OwnBucket:
    """Members with the same new tokens ``n`` and own context ``length`` (the keys after the
    shared pages, their new tokens last)."""
    tokens: torch.Tensor        # [m, n] int64 rows of the step's query tokens, member by member
    pages: torch.Tensor         # [m, p] int64 page ids of each member's own context
    length: int                 # L own keys per member
    masked: CausalTail          # the causal mask of the last n keys


@dataclass(frozen=True)
class ExtendGroup:
    rows: list[int]             # batch rows of the members
    pages: torch.Tensor         # [P] int64 shared page ids (inside every member's cached prefix)
    buckets: tuple[OwnBucket, ...]


def extend_plan(page_table: torch.Tensor, starts: list[int], seq_lens: list[int],
                prefix_lens: list[int], rows: list[int], page_size: int, group_size: int,
                min_keys: int = 0) -> tuple[ExtendGroup, ...]:
    """Groups among extend rows ``rows`` whose cached prefixes begin with the same pages (and
    ``min_keys`` shared keys over the members' new tokens: see
    :func:`~agentlang.runtime.attention.decode_plan.cascade_min_keys`).

    page_table: [B, max_pages]; starts: [B + 1] query-token offsets; group_size: G query heads a
    KV head. A row in no group is left to the caller."""
    table = page_table[rows].long()
    shared, groups = shared_prefix_groups(table, [prefix_lens[b] + 1 for b in rows], page_size,
                                          min_keys, [seq_lens[b] - prefix_lens[b] for b in rows])
    plans = []
    for members, n_shared in groups:
        by_shape: dict[tuple[int, int], list[int]] = {}
        for i in members:
            b = rows[i]
            own = seq_lens[b] - n_shared * page_size
            by_shape.setdefault((seq_lens[b] - prefix_lens[b], own), []).append(i)
        buckets = []
        for (n, own), idx in by_shape.items():
            n_pages = (own + page_size - 1) // page_size
            tokens = torch.tensor([starts[rows[i]] for i in idx])[:, None] + torch.arange(n)
            pages = table[idx, n_shared:n_shared + n_pages]
            buckets.append(OwnBucket(tokens, pages.contiguous(), own, CausalTail(n, group_size)))
        plans.append(ExtendGroup([rows[i] for i in members], table[members[0], :n_shared],
                                 tuple(buckets)))
    return tuple(plans)


def kv_of(pool, layer: int, pages: torch.Tensor, length: int, dtype: torch.dtype
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of ``pages`` ([..., p]) as [..., length, Hkv, D] in ``dtype``."""
    k, v = pool.gather_kv(layer, pages)                                   # [..., p, S, Hkv, D]
    k, v = k.flatten(-4, -3)[..., :length, :, :], v.flatten(-4, -3)[..., :length, :, :]
    if k.dtype != dtype:
        k, v = k.to(dtype), v.to(dtype)
    return k, v


def extend_group(q: torch.Tensor, out: torch.Tensor, pool, layer: int, group: ExtendGroup,
                 scale: float) -> None:
    """Attention of a group's query tokens, written into ``out``. q, out: [T, Hq, D]."""
    _, Hq, D = q.shape
    Hkv = pool.layout.num_kv_heads
    G = Hq // Hkv
    ks, vs = kv_of(pool, layer, group.pages, group.pages.numel() * pool.page_size, q.dtype)
    for bk in group.buckets:
        m, n = bk.tokens.shape
        per = max(1, MAX_QUERY_TOKENS // n)

        def rows(tokens: torch.Tensor) -> torch.Tensor:                  # [mc, Hkv, n*G, D]
            qb = q[tokens.reshape(-1)].view(tokens.shape[0], n, Hkv, G, D).permute(0, 2, 1, 3, 4)
            return qb.reshape(tokens.shape[0], Hkv, n * G, D)             # (token, head) order

        # the shared part of every member at once where the tiles run (their scores are a
        # tile's at a time, so nothing bounds them; one packing of the shared keys a layer:
        # 63 members x 96 rows over 1k keys 6.96 -> 5.85 ms a layer)
        whole = (attend_shared(rows(bk.tokens), ks, vs, scale)
                 if m > per and tiles_take(q, ks, vs) else None)
        for c in range(0, m, per):
            tokens = bk.tokens[c:c + per]                                 # [mc, n]
            qb = rows(tokens)
            o_own, l_own = attend_lse(qb, *kv_of(pool, layer, bk.pages[c:c + per], bk.length,
                                                 q.dtype), scale, bk.masked)
            shared = (attend_shared(qb, ks, vs, scale) if whole is None
                      else (whole[0][c:c + per], whole[1][c:c + per]))
            o = merged(o_own, l_own, *shared)                               # [mc, Hkv, n*G, D]
            mc = tokens.shape[0]
            out[tokens.reshape(-1)] = o.view(mc, Hkv, n, G, D).transpose(1, 2).reshape(
                mc * n, Hq, D)
