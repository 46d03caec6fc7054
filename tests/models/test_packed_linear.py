"""bf16 linears with oneDNN-packed weights: the same bits as ``F.linear``, and which models'
linears get packed."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from agentlang.runtime.models.packed_linear import PackedLinear, pack_linears, packing_available
from agentlang.runtime.quant.native import bf16_matmuls_in_hardware

needs_packing = pytest.mark.skipif(not (packing_available() and bf16_matmuls_in_hardware()),
                                   reason="no oneDNN packing or no bf16 instructions here")


@needs_packing
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_gives_f_linears_bits_at_any_row_count(bias):
    torch.manual_seed(0)
    lin = nn.Linear(576, 960, bias=bias).to(torch.bfloat16)
    packed = PackedLinear(lin)
    for rows in (1, 7, 42, 64, 300):
        x = torch.randn(rows, 576).to(torch.bfloat16)
        assert torch.equal(packed(x), F.linear(x, lin.weight, lin.bias))
    x3 = torch.randn(2, 5, 576).to(torch.bfloat16)                     # leading dims kept
    assert torch.equal(packed(x3), F.linear(x3, lin.weight, lin.bias))


@needs_packing
def test_pack_linears_replaces_bf16_cpu_linears_only():
    model = nn.Sequential(nn.Linear(64, 32).to(torch.bfloat16), nn.Linear(32, 16),
                          nn.Sequential(nn.Linear(16, 8).to(torch.bfloat16)))
    x = torch.randn(3, 64).to(torch.bfloat16)
    before = model[2](model[1](model[0](x).float()).to(torch.bfloat16))
    assert pack_linears(model) == 2
    assert isinstance(model[0], PackedLinear) and type(model[1]) is nn.Linear
    assert isinstance(model[2][0], PackedLinear)
    assert torch.equal(model[2](model[1](model[0](x).float()).to(torch.bfloat16)), before)


def test_packed_linear_refuses_other_dtypes():
    with pytest.raises(ValueError, match="bfloat16 CPU weight"):
        PackedLinear(nn.Linear(8, 4))
