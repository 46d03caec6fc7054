"""Quantized linears against float64 references of the same integer weights."""

import pytest
import torch

from agentlang.runtime.quant.quant_linear import QuantEmbedding, QuantLinear, pack_int4, unpack_int4


@pytest.mark.parametrize("N,K", [(96, 64), (960, 576), (48, 128), (64 * 70, 64)])
def test_int4_pack_layout_round_trips(N, K):
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(q), N, K), q)


@pytest.mark.parametrize("N,K", [(96, 64), (960, 576), (264, 64), (50, 32)])
def test_int4_linear_and_embedding(N, K):
    torch.manual_seed(N)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8)
    s = (torch.rand(N, K // 32) * 0.1).bfloat16().double()     # scales stored in bf16
    z = (torch.randn(N, K // 32) * 0.1).bfloat16().double()
    lin = QuantLinear.from_int4(q.clone(), s.float(), z.float(), bias=torch.ones(N))
    w = ((q.double().view(N, K // 32, 32) - 8) * s[..., None] + z[..., None]).reshape(N, K)
    for T in (1, 3, 40):                                          # kernel path and dense path
        x = torch.randn(T, K, dtype=torch.float64)
        ref = x @ w.T + 1
        y = lin(x.float())
        assert y.shape == (T, N) and y.dtype == torch.float32
        assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2
    ids = torch.tensor([0, 1, 31, 32, 63, N - 1, N // 2, 5]).clamp(max=N - 1)
    e = QuantEmbedding(lin, torch.float32)(ids)
    assert (e.double() - w[ids]).abs().max().item() < 2e-2 * w.abs().max().item()


def test_int8_linear_and_embedding():
    q = torch.randint(-127, 128, (96, 64), dtype=torch.int8)
    s = torch.rand(96).bfloat16().float()
    lin = QuantLinear.from_int8(q, s)
    w = q.double() * s.double()[:, None]
    x = torch.randn(2, 64, dtype=torch.float64)
    assert ((lin(x.float()).double() - x @ w.T).norm() / (x @ w.T).norm()).item() < 1e-2
    assert torch.equal(QuantEmbedding(lin, torch.float32)(torch.tensor([3, 4])).double(), w[[3, 4]])


def test_bad_kind():
    with pytest.raises(ValueError, match="kind must be 'int4' or 'int8'"):
        QuantLinear("int2", 4, 4, torch.zeros(1), torch.zeros(1))
