"""Many query rows over one shared K/V on AMX tiles (``shared_attention.c``, the cascade's
shared part) against a float64 reference; its rows' independence; the builds without tiles."""

import pytest
import torch

from agentlang.runtime.attention.cascade import attend_lse, attend_shared


def reference(q, k, v, scale):
    """float64 out [H, R, D] and lse [H, R] of q [H, R, D] over k, v [L, H, D]."""
    s = torch.einsum("hrd,lhd->hrl", q.double(), k.double()) * scale
    return torch.einsum("hrl,lhd->hrd", s.softmax(-1), v.double()), torch.logsumexp(s, -1)


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| (Frobenius, float64)."""
    return ((out.double() - ref).norm() / ref.norm()).item()


def inputs(H, R, D, L, seed, spare_heads=0):
    """q [H, R, D]; k, v [L, H, D] bf16, each a slice of [L, H + spare_heads, D] when
    spare_heads (keys further apart than H * D, as a pool's other heads leave them)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(H, R, D, generator=g).bfloat16()
    k = torch.randn(L, H + spare_heads, D, generator=g).bfloat16()[:, :H]
    v = torch.randn(L, H + spare_heads, D, generator=g).bfloat16()[:, :H]
    return q, k, v


def tiles_or_skip(native_lib, q, k, v, scale, causal=None):
    out = native_lib.attend_shared_bf16(q, k, v, scale, causal)
    if out is None:
        assert native_lib.isa.name != "amx" or not _amx_bf16(), "the AMX build refused"
        pytest.skip(f"the {native_lib.isa.name} build (or this CPU) has no bf16 tiles")
    return out


def _amx_bf16() -> bool:
    from agentlang.runtime.quant.native.cpu_features import cpu_flags

    return {"amx_bf16", "avx512_bf16"} <= cpu_flags()


@pytest.mark.parametrize("H,R,D,L", [(3, 192, 64, 1024), (3, 37, 64, 1000), (2, 5, 128, 77),
                                     (1, 16, 64, 16), (3, 17, 64, 33), (1, 1, 128, 1)])
@pytest.mark.parametrize("spare_heads", [0, 2])
def test_against_float64(native_lib, H, R, D, L, spare_heads):
    """Rows not a multiple of 16, keys not a multiple of 16 or 32 (the packs' padding), both
    head dims, keys further apart than one row of heads; within bf16 rounding of float64 and
    at least as close as torch's bf16 path (whose scores are rounded to bf16)."""
    q, k, v = inputs(H, R, D, L, seed=R + L, spare_heads=spare_heads)
    out, lse = tiles_or_skip(native_lib, q, k, v, D ** -0.5)
    ref, ref_lse = reference(q, k, v, D ** -0.5)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape and lse.shape == (H, R)
    torch_out, torch_lse = attend_lse(q, k, v, D ** -0.5)
    assert rel_err(out, ref) < 4e-3 and rel_err(out, ref) <= rel_err(torch_out, ref)
    assert (lse.double() - ref_lse).abs().max().item() < 1e-5 * ref_lse.abs().max().item() + 1e-5


def test_a_rows_result_does_not_depend_on_the_other_rows(native_lib):
    """Each row alone gives the bits it gets among 40 others, wherever its 16-row tile puts
    it (the invariance the engine's greedy outputs rest on)."""
    q, k, v = inputs(3, 41, 64, 300, seed=5)
    out, lse = tiles_or_skip(native_lib, q, k, v, 0.125)
    for r in (0, 7, 16, 40):
        one, one_lse = native_lib.attend_shared_bf16(q[:, r:r + 1].contiguous(), k, v, 0.125)
        assert torch.equal(one[:, 0], out[:, r]) and torch.equal(one_lse[:, 0], lse[:, r])


def test_rejects_what_it_cannot_take(native_lib):
    q, k, v = inputs(2, 4, 64, 20, seed=1)
    with pytest.raises(ValueError, match="attend_shared_bf16"):
        native_lib.attend_shared_bf16(q.float(), k, v, 0.125)
    with pytest.raises(ValueError, match="attend_shared_bf16"):
        native_lib.attend_shared_bf16(q, k.transpose(0, 1).contiguous().transpose(0, 1), v, 0.125)
    q48, k48, v48 = inputs(2, 4, 48, 20, seed=1)
    assert native_lib.attend_shared_bf16(q48, k48, v48, 0.125) is None      # D 48: no tiles


def test_attend_shared_takes_the_tiles_and_keeps_its_contract():
    """cascade.attend_shared (q [M, Hkv, R, D]) gives the reference's result in its own
    layout whichever path runs."""
    g = torch.Generator().manual_seed(2)
    M, H, G, D, L = 9, 3, 3, 64, 250
    q = torch.randn(M, H, G, D, generator=g).bfloat16()
    k = torch.randn(L, H, D, generator=g).bfloat16()
    v = torch.randn(L, H, D, generator=g).bfloat16()
    out, lse = attend_shared(q, k, v, 0.125)
    ref, ref_lse = reference(q.transpose(0, 1).reshape(H, M * G, D), k, v, 0.125)
    assert out.shape == (M, H, G, D) and lse.shape == (M, H, G)
    assert (out.double() - ref.view(H, M, G, D).transpose(0, 1)).abs().max().item() < 8e-3
    assert (lse.double() - ref_lse.view(H, M, G).transpose(0, 1)).abs().max().item() < 1e-4


@pytest.mark.parametrize("H,n,G,D,L", [(3, 300, 3, 64, 300), (3, 33, 3, 64, 1000),
                                       (2, 17, 2, 128, 40), (1, 5, 4, 64, 5), (3, 70, 3, 64, 90)])
def test_a_causal_block_against_float64(native_lib, H, n, G, D, L):
    """causal (n, G): row r sees keys up to L - n + r // G (cascade.CausalTail's mask): the
    float64 reference with that mask, as close as torch's bf16 path."""
    from agentlang.runtime.attention.cascade import CausalTail

    q, k, v = inputs(H, n * G, D, L, seed=n + L)
    out, lse = tiles_or_skip(native_lib, q, k, v, D ** -0.5, (n, G))
    s = torch.einsum("hrd,lhd->hrl", q.double(), k.double()) * D ** -0.5
    s[..., L - n:] = s[..., L - n:].masked_fill(CausalTail(n, G).mask, float("-inf"))
    ref = torch.einsum("hrl,lhd->hrd", s.softmax(-1), v.double())
    torch_out, _ = attend_lse(q, k, v, D ** -0.5, CausalTail(n, G))
    assert rel_err(out, ref) < 4e-3 and rel_err(out, ref) <= rel_err(torch_out, ref)
    assert (lse.double() - torch.logsumexp(s, -1)).abs().max().item() < 1e-4
    with pytest.raises(ValueError, match="causal"):
        native_lib.attend_shared_bf16(q, k, v, 0.125, (n + 1, G))


def test_tokens_first_layout_gives_the_same_bits_in_place(native_lib):
    """q [T, H, G, D] (a prefill's own layout, rows (t, g) of each head) read and the output
    written in that layout, into the given tensor: the bits of the [H, R, D] call."""
    q, k, v = inputs(3, 40 * 3, 64, 90, seed=9)                  # [H, T G, D]
    heads_first = tiles_or_skip(native_lib, q, k, v, 0.125, (40, 3))
    tokens_first = q.view(3, 40, 3, 64).permute(1, 0, 2, 3).contiguous()     # [T, H, G, D]
    out = torch.empty_like(tokens_first)
    got, lse = native_lib.attend_shared_bf16(tokens_first, k, v, 0.125, (40, 3), out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(out.permute(1, 0, 2, 3).reshape(3, 120, 64), heads_first[0])
    assert torch.equal(lse, heads_first[1])
