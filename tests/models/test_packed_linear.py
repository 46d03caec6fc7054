"""bf16 linears with oneDNN-packed weights: the same bits as ``F.linear``, and which models'
linears get packed."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from agentlang.runtime.models.packed_linear import PackedLinear, pack_linears, packing_available
from agentlang.runtime.quant.native.cpu_features import bf16_matmuls_in_hardware

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
    model = nn.Sequential(nn.Linear(64, 32).to(torch.bfloat16), nn.Linear(32, 16).half(),
                          nn.Sequential(nn.Linear(16, 8).to(torch.bfloat16)), nn.Linear(8, 4))
    x = torch.randn(3, 64).to(torch.bfloat16)

    def run():
        h = model[1](model[0](x).half()).to(torch.bfloat16)
        return model[3](model[2](h).float())
    before = run()
    assert pack_linears(model) == 3                       # bf16 and float32; not float16
    assert isinstance(model[0], PackedLinear) and type(model[1]) is nn.Linear
    assert isinstance(model[2][0], PackedLinear) and isinstance(model[3], PackedLinear)
    assert (run() - before).abs().max().item() < 1e-5


def test_packed_linear_refuses_other_dtypes():
    with pytest.raises(ValueError, match="bfloat16 or float32 CPU weight"):
        PackedLinear(nn.Linear(8, 4).half())


@pytest.mark.skipif(not packing_available(), reason="no oneDNN packing in this build")
def test_packed_float32_linear_agrees_with_f_linear():
    """float32: oneDNN's sums, not MKL's: equal to float32 rounding."""
    torch.manual_seed(1)
    lin = nn.Linear(576, 1536)
    packed = PackedLinear(lin)
    for rows in (1, 42, 300):
        x = torch.randn(rows, 576)
        ref = F.linear(x.double(), lin.weight.double(), lin.bias.double())
        assert (packed(x).double() - ref).abs().max().item() < 1e-4
