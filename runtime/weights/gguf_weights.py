"""GGUF tensors → the runtime's linear layers: kept quantized, or decoded to a dense dtype.

Block layouts (32 weights a block, little-endian), decoded with numpy views of the raw rows:

* Q4_0: ``d`` fp16, 16 bytes of nibbles; weight j = (nibble j - 8) * d, low nibbles are j < 16.
* Q4_1: ``d``, ``m`` fp16, 16 bytes of nibbles; weight j = nibble j * d + m.
* Q8_0: ``d`` fp16, 32 int8; weight j = q_j * d.

Q4_0/Q4_1/Q8_0 stay as the file's blocks in a :class:`~agentlang.runtime.quant.block_linear.BlockLinear` (the
native matmul) where :func:`agentlang.runtime.quant.native.qmatmul_library` runs; otherwise Q4_0/Q4_1 become
int4 groupwise :class:`~agentlang.runtime.quant.quant_linear.QuantLinear` without re-quantization and Q8_0 int8
per row (re-scaled: ``row scale = max|w| / 127``). Q4_K / Q5_K / Q6_K stay as their
super-blocks (:class:`~agentlang.runtime.quant.kblock_linear.KBlockLinear`) where the native build has
K-quant kernels, a fused linear of mixed types as one chained native weight
(:class:`~agentlang.runtime.quant.kblock_linear.ChainLinear`). Other types (F16/BF16/F32, Q5_0/Q5_1,
Q2_K/Q3_K, K-quants without those kernels) are decoded with the ``gguf`` package and kept dense
in the compute dtype; the loader reports which (``report``, logged at load). All decoding runs a bounded number of rows at a
time, so no dense fp32 copy of a whole tensor (let alone the model) is made on the quantized
path.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from agentlang.runtime.quant.block_linear import BF16_GEMM_ROWS, BlockLinear
from agentlang.runtime.quant.kblock_linear import ChainLinear, KBlockLinear
from agentlang.runtime.quant.kquant import KINDS as K_TYPES, ROW_MULTIPLE, KBlocks, split_kblocks
from agentlang.runtime.weights.gguf_file import KEPT_QUANTIZED, GgufFile
from agentlang.runtime.quant.native import (KIND_Q4, KIND_Q8, QMatmulLibrary, kquant_library,
                                            qmatmul_library)
from agentlang.runtime.quant.native.cpu_features import bf16_matmuls_in_hardware
from agentlang.runtime.quant.quant_linear import QuantLinear

CHUNK_ROWS = 4096


def _blocks(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    """uint8 ``[N, nb * block_bytes]`` → ``[N, nb, block_bytes]``."""
    return np.ascontiguousarray(raw).reshape(raw.shape[0], -1, block_bytes)


def _half(b: np.ndarray, at: int) -> torch.Tensor:
    """The fp16 at byte ``at`` of every block → float16 ``[N, nb]``."""
    return torch.from_numpy(np.ascontiguousarray(b[..., at:at + 2]).view(np.float16)[..., 0])


def _f16(b: np.ndarray, at: int) -> torch.Tensor:
    """The fp16 at byte ``at`` of every block → float32 ``[N, nb]``."""
    return _half(b, at).float()


def split_blocks(raw: np.ndarray, qtype: str
                 ) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Q4_0/Q4_1/Q8_0 rows → (kind, qs, d, m) as :class:`BlockLinear` stores them: qs the
    quant bytes (Q4 uint8 ``[N, K/2]``, Q8 int8 ``[N, K]``), d and Q4_1's m float16 ``[N, nb]``."""
    if qtype == "Q8_0":
        b = _blocks(raw, 34)
        q = np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(b.shape[0], -1)
        return KIND_Q8, torch.from_numpy(q), _half(b, 0), None
    b = _blocks(raw, 18 if qtype == "Q4_0" else 20)
    start = 2 if qtype == "Q4_0" else 4
    qs = torch.from_numpy(np.ascontiguousarray(b[..., start:]).reshape(b.shape[0], -1))
    return KIND_Q4, qs, _half(b, 0), (_half(b, 2) if qtype == "Q4_1" else None)


def block_linear(lib: QMatmulLibrary, parts: list[tuple[np.ndarray, str]],
                 bias: torch.Tensor | None = None) -> BlockLinear:
    """A :class:`BlockLinear` from GGUF rows ``parts`` = [(raw rows, qtype)], concatenated."""
    return BlockLinear.from_blocks(lib, [split_blocks(raw, qtype) for raw, qtype in parts], bias)


def _nibbles(qs: np.ndarray) -> torch.Tensor:
    """uint8 ``[N, nb, 16]`` → ``[N, nb * 32]`` values 0..15 (low nibbles first in each block)."""
    q = np.concatenate([qs & 15, qs >> 4], axis=-1)
    return torch.from_numpy(q.reshape(q.shape[0], -1))


def decode_int4(raw: np.ndarray, qtype: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_0/Q4_1 rows → (q uint8 ``[N, K]``, scale ``[N, K/32]``, zero ``[N, K/32]``),
    with ``w = (q - 8) * scale + zero``."""
    if qtype == "Q4_0":
        b = _blocks(raw, 18)
        d = _f16(b, 0)
        return _nibbles(b[..., 2:]), d, torch.zeros_like(d)
    b = _blocks(raw, 20)
    d, m = _f16(b, 0), _f16(b, 2)
    return _nibbles(b[..., 4:]), d, m + 8 * d


def decode_int8_rows(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 rows → (q int8 ``[N, K]``, per-row scale ``[N]``), re-scaled to one scale a row."""
    b = _blocks(raw, 34)
    d = _f16(b, 0)                                                            # [N, nb]
    q = torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8))       # [N, nb, 32]
    w = q.float() * d[..., None]
    scale = (w.abs().amax(dim=(1, 2)) / 127).clamp(min=1e-12)                 # [N]
    q8 = torch.round(w / scale[:, None, None]).clamp(-127, 127).to(torch.int8)
    return q8.reshape(q8.shape[0], -1), scale


def decode_dense(raw: np.ndarray, qtype: str, dtype: torch.dtype) -> torch.Tensor:
    """Any supported type → dense ``dtype`` (decoded ``CHUNK_ROWS`` rows at a time)."""
    from gguf import GGMLQuantizationType, quants

    if qtype in ("F32", "F16"):
        return torch.from_numpy(np.array(raw, dtype=np.float32)).to(dtype)
    if qtype == "BF16":                     # read as uint16: the high half of a float32
        return torch.from_numpy((raw.astype(np.uint32) << 16).view(np.float32)).to(dtype)
    gtype = GGMLQuantizationType[qtype]
    parts = [torch.from_numpy(quants.dequantize(np.asarray(raw[i:i + CHUNK_ROWS]), gtype)).to(dtype)
             for i in range(0, raw.shape[0], CHUNK_ROWS)]
    return torch.cat(parts)


def _chunked(fn, raw: np.ndarray):
    outs = [fn(raw[i:i + CHUNK_ROWS]) for i in range(0, raw.shape[0], CHUNK_ROWS)]
    return tuple(torch.cat(parts) for parts in zip(*outs))


class LinearBuilder:
    """Builds the model's linears from a :class:`GgufFile`: ``weights="auto"`` keeps Q4_0/Q4_1/Q8_0
    quantized, ``"dense"`` decodes everything to ``dtype``. ``report`` counts how each GGUF type
    was treated (e.g. ``{"Q4_1": "native blocks", "Q6_K": "dense bfloat16"}``)."""

    def __init__(self, gf: GgufFile, weights: str, dtype: torch.dtype, kernels: str = "auto",
                 bf16_gemm_rows: int | None = None):
        if weights not in ("auto", "dense"):
            raise ValueError(f"weights must be 'auto' or 'dense', got {weights!r}")
        if kernels not in ("auto", "torch"):
            raise ValueError(f"kernels must be 'auto' (native where it runs) or 'torch', got {kernels!r}")
        self.gf, self.quantize, self.dtype = gf, weights == "auto", dtype
        # native weights' calls of this many rows on run as bf16 GEMMs (None: the dtype's
        # default, BF16_GEMM_ROWS for bfloat16 models, never for float32 ones)
        self.bf16_gemm_rows = (bf16_gemm_rows if bf16_gemm_rows is not None else
                               BF16_GEMM_ROWS if dtype == torch.bfloat16 else None)
        self.native = qmatmul_library() if kernels == "auto" and self.quantize else None
        if self.native is not None and not self.native.isa.kquants and set(gf.types()) & set(K_TYPES):
            self.native = kquant_library()      # a build with K-quant kernels, if one runs here
        self.report: dict[str, str] = {}

    def vector(self, name: str) -> torch.Tensor | None:
        """A 1-D tensor (norm weight, bias) in the compute dtype, or None if absent."""
        t = self.gf.tensors.get(name)
        return None if t is None else decode_dense(t.read(self.gf.path), t.qtype, self.dtype).reshape(-1)

    def linear(self, names: list[str], heads: list[int | None] | None = None,
               biases: list[str] | None = None) -> nn.Module:
        """One linear whose weight is the row-concatenation of GGUF tensors ``names``."""
        heads = heads or [None] * len(names)
        raws = [self.gf.rows(n, h) for n, h in zip(names, heads)]
        qtypes = {self.gf.tensors[n].qtype for n in names}
        bias = None
        if biases and all(b in self.gf.tensors for b in biases):
            bias = torch.cat([self.vector(b) for b in biases])
        qtype = next(iter(qtypes)) if len(qtypes) == 1 else None
        native_k = self.native is not None and self.native.isa.kquants
        k = self.gf.tensors[names[0]].shape[-1]
        if self.quantize and native_k and qtypes <= set(KEPT_QUANTIZED) | set(K_TYPES) \
                and (qtypes & set(K_TYPES) or len(qtypes) > 1) \
                and all(k % ROW_MULTIPLE.get(t, 32) == 0 for t in qtypes):
            return self._gemm_rows(self._native_parts(names, raws, biases if bias is not None else None))
        if self.quantize and qtype in KEPT_QUANTIZED:
            if self.native is not None:
                self.report[qtype] = "native blocks"
                return self._gemm_rows(block_linear(self.native, [(r, qtype) for r in raws], bias))
            if qtype == "Q8_0":
                self.report[qtype] = "int8 per row"
                q, s = zip(*(_chunked(decode_int8_rows, r) for r in raws))
                return QuantLinear.from_int8(torch.cat(q), torch.cat(s), bias)
            self.report[qtype] = "int4 groupwise"
            q, s, z = zip(*(_chunked(lambda x: decode_int4(x, qtype), r) for r in raws))
            return QuantLinear.from_int4(torch.cat(q), torch.cat(s), torch.cat(z), bias)
        for n in names:
            t = self.gf.tensors[n]
            self.report.setdefault(t.qtype, f"dense {str(self.dtype).removeprefix('torch.')}")
        w = torch.cat([decode_dense(r, self.gf.tensors[n].qtype, self.dtype) for n, r in zip(names, raws)])
        lin = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, device="meta")  # dense
        lin.weight = nn.Parameter(w, requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias.to(self.dtype), requires_grad=False)
        return lin

    def _gemm_rows(self, lin: BlockLinear) -> BlockLinear:
        """``lin``, its calls of ``bf16_gemm_rows`` rows or more run as bf16 GEMMs on a CPU with
        bf16 instructions (``block_linear.py``'s module doc)."""
        if self.bf16_gemm_rows is not None and bf16_matmuls_in_hardware():
            lin.use_bf16_gemms(self.bf16_gemm_rows, self.dtype)
        return lin

    def _native_parts(self, names: list[str], raws: list[np.ndarray],
                      biases: list[str] | None) -> BlockLinear:
        """Tensors ``names`` (K-quants, or Q4/Q8 types mixed) as native weights: consecutive
        tensors of one type fused into one part, the parts chained if more than one."""
        groups: list[tuple[str, list[int]]] = []
        for i, n in enumerate(names):
            t = self.gf.tensors[n].qtype
            if groups and groups[-1][0] == t:
                groups[-1][1].append(i)
            else:
                groups.append((t, [i]))
        parts = []
        for qtype, idx in groups:
            bias = None if biases is None else torch.cat([self.vector(biases[i]) for i in idx])
            if qtype in K_TYPES:
                self.report[qtype] = "native blocks" if qtype in ROW_MULTIPLE else "native super-blocks"
                blocks = KBlocks.cat([split_kblocks(raws[i][r:r + CHUNK_ROWS], qtype)   # bounded
                                      for i in idx for r in range(0, raws[i].shape[0], CHUNK_ROWS)])
                parts.append(KBlockLinear(self.native, blocks, bias))
            else:
                self.report[qtype] = "native blocks"
                parts.append(block_linear(self.native, [(raws[i], qtype) for i in idx], bias))
        return parts[0] if len(parts) == 1 else ChainLinear(self.native, parts)
