"""bf16 linears on CPU with their weights reordered once into oneDNN's blocked layout.

``F.linear`` on a bf16 CPU tensor runs oneDNN's GEMM, which first reorders the weight into the
blocked layout its kernels read — on every call. Reordering once, at load
(``torch.ops.mkldnn._reorder_linear_weight``), and calling the GEMM on the packed weight
(``torch.ops.mkldnn._linear_pointwise``, the pair torch's own compiler emits for CPU linears)
gives the same bits (the same kernel on the same layout) and, measured on a 2-core Zen 4 EPYC
with the embedded model's shapes: 1.15–1.4× at a decode batch of 42–64 rows, 1.3–1.6× for the
49k-row LM head, 1.02–1.16× at prefill sizes (issue 29). It is used where bf16 GEMMs run on
bf16 instructions (:func:`agentlang.runtime.quant.native.bf16_matmuls_in_hardware`) and the
build has the two ops; elsewhere the model keeps ``nn.Linear``. A tied LM head gets its own
packed copy (the embedding table stays as it is for lookups): +2 bytes a weight of the vocab
× hidden table (56 MB for the embedded model).
"""

from __future__ import annotations

import torch
from torch import nn

from agentlang.runtime.quant.native import bf16_matmuls_in_hardware

ROWS_HINT = 64      # the batch size oneDNN chooses the layout for (any row count runs)


def packing_available() -> bool:
    """Whether this torch build has oneDNN's reorder and packed linear ops."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedLinear(nn.Module):
    """``nn.Linear``'s ``y = x @ W.T + b`` on a weight packed once (module doc). x: ``[..., in]``
    bfloat16 on the CPU -> ``[..., out]``."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach()
        if w.dtype != torch.bfloat16 or w.device.type != "cpu":
            raise ValueError(f"PackedLinear takes a bfloat16 CPU weight, got {w.dtype} on {w.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(w, ROWS_HINT),
                             persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach(),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self.packed,
                                               self.bias, "none", [], "")
        return y.view(*lead, self.out_features)


def pack_linears(model: nn.Module) -> int:
    """Replace every bf16 CPU ``nn.Linear`` in ``model`` by a :class:`PackedLinear` where
    packing applies here (module doc); returns how many were replaced."""
    if not (packing_available() and bf16_matmuls_in_hardware()):
        return 0
    targets = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children()
               if type(child) is nn.Linear and child.weight.dtype == torch.bfloat16
               and child.weight.device.type == "cpu"]
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child))
    return len(targets)
