"""Dense linears on CPU with their weights reordered once into oneDNN's blocked layout.

``F.linear`` on a bf16 CPU tensor runs oneDNN's GEMM, which first reorders the weight into the
blocked layout its kernels read — on every call; on a float32 one it runs MKL's, which on AMD
processors takes its AVX2 code. Reordering once, at load
(:func:`agentlang.runtime.attention.onednn.pack_weight`), and calling oneDNN's GEMM on the
packed weight (:func:`~agentlang.runtime.attention.onednn.linear`: the pair of ops torch's own
compiler emits for CPU linears)
measured on a 2-core Zen 4 EPYC with the embedded model's shapes (issue 29):

* bf16: the same bits as ``F.linear`` (the same kernel on the same layout); 1.15–1.4× at a
  decode batch of 42–64 rows, 1.3–1.6× for the 49k-row LM head, 1.02–1.16× at prefill sizes.
  Used where bf16 GEMMs run on bf16 instructions
  (:func:`agentlang.runtime.quant.native.cpu_features.bf16_matmuls_in_hardware`).
* float32: 1.4–2.5× MKL at 8–64 rows, 2.1–4.5× for the LM head, 1.1–2× at 2048 rows. The
  bits differ from MKL's in the last places (another summation order); a row's result
  is as independent of the batch as MKL's was (neither library promises it; the invariance
  tests hold it to greedy tokens, as before).

Elsewhere, or where the build lacks the two ops, the model keeps ``nn.Linear``. A tied LM
head gets its own packed copy (the embedding table stays as it is for lookups): one more
vocab × hidden table (56 MB in bf16, 113 MB in float32 for the embedded model).
"""

from __future__ import annotations

import torch
from torch import nn

from agentlang.runtime.attention import onednn
from agentlang.runtime.quant.native.cpu_features import bf16_matmuls_in_hardware

ROWS_HINT = 64      # the batch size oneDNN chooses the layout for (any row count runs)
PACKED_DTYPES = (torch.bfloat16, torch.float32)


def packing_available() -> bool:
    """Whether this torch build has oneDNN's reorder and packed linear ops."""
    return onednn.PACKING


class PackedLinear(nn.Module):
    """``nn.Linear``'s ``y = x @ W.T + b`` on a weight packed once (module doc). x: ``[..., in]``
    in the weight's dtype (bfloat16 or float32) on the CPU -> ``[..., out]``."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach()
        if w.dtype not in PACKED_DTYPES or w.device.type != "cpu":
            raise ValueError(f"PackedLinear takes a bfloat16 or float32 CPU weight, got {w.dtype} "
                             f"on {w.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", onednn.pack_weight(w, ROWS_HINT), persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach(),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = onednn.linear(x.reshape(-1, self.in_features), self.packed, self.bias)
        return y.view(*lead, self.out_features)


def packs(dtype: torch.dtype) -> bool:
    """Whether linears of ``dtype`` are packed here (module doc)."""
    if not packing_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and bf16_matmuls_in_hardware())


def pack_linears(model: nn.Module) -> int:
    """Replace every CPU ``nn.Linear`` of a dtype :func:`packs` takes in ``model`` by a
    :class:`PackedLinear`; returns how many were replaced."""
    targets = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children()
               if type(child) is nn.Linear and child.weight.device.type == "cpu"
               and packs(child.weight.dtype)]
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child))
    return len(targets)
