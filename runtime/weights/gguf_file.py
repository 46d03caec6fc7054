"""A GGUF model file, validated: architecture, config from metadata, tensor names/types/shapes.

:func:`open_gguf` reads only the header and checks everything
a load needs before any weight is decoded: the architecture is one of :data:`~agentlang.runtime.weights.gguf_arch.ARCHITECTURES`, every
tensor type is one we can decode, every expected tensor is present with the shape the metadata
implies, and the file is long enough for every tensor. Any failure raises :class:`GgufError`
naming what was found and what is supported, so a bad file never yields a half-loaded model.

Tensor data are read one tensor at a time with plain reads (not kept mapped), so a load's
resident memory is what it builds plus one tensor in flight. Row order: llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` of Llama-arch
models (interleaved RoPE pairs); :meth:`GgufFile.rows` undoes it on the raw (still quantized)
rows, so weights come out in HF's "rotate half" order.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agentlang.runtime.weights.gguf_arch import (ARCHITECTURES, PERMUTED_QK, arch_config,
                                                layer_shapes)
from agentlang.runtime.weights.model_loader import ModelLoadError

KEPT_QUANTIZED = ("Q4_0", "Q4_1", "Q8_0")                       # int4 / int8 kernels
DEQUANTIZED = ("F32", "F16", "BF16", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
               "Q8_K")                                          # decoded to the compute dtype
SUPPORTED_TYPES = KEPT_QUANTIZED + DEQUANTIZED


class GgufError(ModelLoadError):
    """A GGUF file cannot be loaded; the message names what was found and what is supported."""


_PLAIN = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


@dataclass(frozen=True)
class GgufTensor:
    name: str
    qtype: str                 # GGML type name, e.g. "Q4_1"
    shape: tuple[int, ...]     # torch order: (rows, cols) for matrices, (n,) for vectors
    offset: int                # absolute byte offset in the file
    rows: int
    row_bytes: int

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    def read(self, path: Path) -> np.ndarray:
        """The stored data, read (not mapped: file pages do not stay in this process's RSS).
        Quantized: uint8 ``[rows, row bytes]``; F32/F16/BF16: ``shape`` in that type."""
        raw = np.fromfile(path, dtype=np.uint8, count=self.nbytes, offset=self.offset)
        if self.qtype in _PLAIN:
            return raw.view(_PLAIN[self.qtype]).reshape(self.shape)
        return raw.reshape(self.rows, self.row_bytes)


class GgufFile:
    """Header, config and tensor access of a validated GGUF file (see module doc)."""

    def __init__(self, path: Path, arch: str, meta: dict, tensors: dict[str, GgufTensor]):
        self.path, self.arch, self.meta, self.tensors = path, arch, meta, tensors

    def config_dict(self) -> dict:
        """An HF ``config.json``-style dict built from the metadata."""
        a, m = self.arch, self.meta
        heads = int(m[f"{a}.attention.head_count"])
        hidden = int(m[f"{a}.embedding_length"])
        head_dim = int(m.get(f"{a}.attention.key_length", hidden // heads))
        eos = m.get("tokenizer.ggml.eos_token_id")
        cfg = {
            "architectures": [ARCHITECTURES[a]],
            "model_type": a,                       # GGUF's arch names are HF's model types
            "vocab_size": self.tensors["token_embd.weight"].shape[0],
            "hidden_size": hidden,
            "intermediate_size": int(m[f"{a}.feed_forward_length"]),
            "num_hidden_layers": int(m[f"{a}.block_count"]),
            "num_attention_heads": heads,
            "num_key_value_heads": int(m.get(f"{a}.attention.head_count_kv", heads)),
            "head_dim": head_dim,
            "rms_norm_eps": float(m.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(m.get(f"{a}.rope.freq_base", 10000.0)),
            "max_position_embeddings": int(m.get(f"{a}.context_length", 4096)),
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "attention_bias": "blk.0.attn_q.bias" in self.tensors or "blk.0.attn_qkv.bias" in self.tensors,
            "eos_token_id": None if eos is None else int(eos),
            "bos_token_id": m.get("tokenizer.ggml.bos_token_id"),
        }
        if m.get(f"{a}.rope.scaling.type") == "linear":
            cfg["rope_scaling"] = {"rope_type": "linear",
                                   "factor": float(m[f"{a}.rope.scaling.factor"])}
        cfg.update(arch_config(a, m, head_dim, self.vector_list))
        return cfg

    def vector_list(self, name: str) -> list[float] | None:
        """A small F32/F16 tensor's values (rope factors), or None if the file has none."""
        t = self.tensors.get(name)
        if t is None:
            return None
        if t.qtype not in ("F32", "F16"):
            raise GgufError(f"{self.path}: tensor {name} is {t.qtype}; it must be F32 or F16")
        return [float(v) for v in t.read(self.path).reshape(-1)]

    def rows(self, name: str, heads: int | None = None) -> np.ndarray:
        """The raw rows of tensor ``name`` (HF row order; ``heads`` for q/k un-permutation)."""
        t = self.tensors[name]
        data = t.read(self.path)
        if heads is not None and self.arch in PERMUTED_QK and data.ndim == 2:
            n = data.shape[0]
            data = data.reshape(heads, n // heads // 2, 2, -1).swapaxes(1, 2).reshape(n, -1)
        return data

    def types(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors.values():
            out[t.qtype] = out.get(t.qtype, 0) + 1
        return out


def open_gguf(path: str | Path) -> GgufFile:
    """Read and validate ``path`` (see module doc); raises :class:`GgufError`."""
    from gguf import GGMLQuantizationType, GGML_QUANT_SIZES

    path = Path(path)
    if not path.is_file():
        raise GgufError(f"GGUF file does not exist: {path}")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        meta, infos, data_start = _read_header(data)
    except (ValueError, IndexError, struct.error, UnicodeDecodeError) as e:
        raise GgufError(f"{path} is not a readable GGUF file (truncated or corrupt?): {e}") from None
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GgufError(f"{path}: unsupported GGUF architecture {arch!r}; "
                        f"supported: {', '.join(ARCHITECTURES)}")
    tensors = {}
    for name, dims, type_id, offset in infos:
        try:
            qtype = GGMLQuantizationType(type_id).name
        except ValueError:
            qtype = f"type {type_id}"
        if qtype not in SUPPORTED_TYPES:
            raise GgufError(f"{path}: tensor {name} has unsupported type {qtype}; "
                            f"supported: {', '.join(SUPPORTED_TYPES)}")
        shape = tuple(reversed(dims))                 # GGUF lists the fastest dimension first
        block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
        if shape[-1] % block:
            raise GgufError(f"{path}: tensor {name} rows of {shape[-1]} are not whole "
                            f"{qtype} blocks of {block}")
        row_bytes = shape[-1] // block * nbytes
        rows = math.prod(shape[:-1])
        start, end = data_start + offset, data_start + offset + rows * row_bytes
        if end > data.shape[0]:
            raise GgufError(f"{path}: truncated file: tensor {name} ends at byte {end}, "
                            f"the file has {data.shape[0]}")
        tensors[name] = GgufTensor(name, qtype, shape, start, rows, row_bytes)
    del data                                          # unmap: weights are read tensor by tensor
    gf = GgufFile(path, arch, meta, tensors)
    _check_shapes(gf)
    return gf


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}


def _read_header(buf: np.ndarray) -> tuple[dict, list, int]:
    """GGUF v2/v3 header → (metadata, [(name, dims, type id, offset)], data start).

    Long arrays (the tokenizer's vocabulary and merges) are skipped, not decoded: the tokenizer
    is read by transformers; only scalars, strings and short arrays are kept."""
    mv = memoryview(buf)
    if bytes(mv[:4]) != b"GGUF":
        raise ValueError("no GGUF magic")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", mv, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (supported: 2, 3)")
    pos = 24

    def string(pos):
        (n,) = struct.unpack_from("<Q", mv, pos)
        if pos + 8 + n > len(mv):
            raise ValueError("string past the end of the file")
        return bytes(mv[pos + 8:pos + 8 + n]).decode("utf-8"), pos + 8 + n

    def value(t, pos, keep=True):
        if t == 8:
            return string(pos)
        if t == 9:
            (et, n) = struct.unpack_from("<IQ", mv, pos)
            pos += 12
            if et != 8 and et != 9:
                size = struct.calcsize(_SCALARS[et])
                vals = list(np.frombuffer(mv[pos:pos + n * size], _SCALARS[et][1:]).tolist()) \
                    if keep and n <= 4096 else None
                return vals, pos + n * size
            out = []
            for _ in range(n):
                v, pos = value(et, pos, keep and n <= 4096)
                out.append(v)
            return (out if keep and n <= 4096 else None), pos
        fmt = _SCALARS[t]
        return struct.unpack_from(fmt, mv, pos)[0], pos + struct.calcsize(fmt)

    meta = {}
    for _ in range(n_kv):
        key, pos = string(pos)
        (t,) = struct.unpack_from("<I", mv, pos)
        meta[key], pos = value(t, pos + 4)
    infos = []
    for _ in range(n_tensors):
        name, pos = string(pos)
        (nd,) = struct.unpack_from("<I", mv, pos)
        dims = struct.unpack_from(f"<{nd}Q", mv, pos + 4)
        type_id, offset = struct.unpack_from("<IQ", mv, pos + 4 + 8 * nd)
        pos += 4 + 8 * nd + 12
        infos.append((name, [int(d) for d in dims], type_id, offset))
    align = int(meta.get("general.alignment", 32))
    return meta, infos, -(-pos // align) * align


def _check_shapes(gf: GgufFile) -> None:
    """Every tensor the model needs is present with the shape the metadata says."""
    a, m = gf.arch, gf.meta
    try:
        H = int(m[f"{a}.embedding_length"])
        n_layers = int(m[f"{a}.block_count"])
        I = int(m[f"{a}.feed_forward_length"])
        heads = int(m[f"{a}.attention.head_count"])
    except KeyError as e:
        raise GgufError(f"{gf.path}: metadata key {e.args[0]} missing") from None
    kv = int(m.get(f"{a}.attention.head_count_kv", heads))
    hd = int(m.get(f"{a}.attention.key_length", H // heads))
    if "token_embd.weight" not in gf.tensors:
        raise GgufError(f"{gf.path}: no token_embd.weight tensor")
    V = gf.tensors["token_embd.weight"].shape[0]
    want = {"token_embd.weight": (V, H), "output_norm.weight": (H,)}
    if "output.weight" in gf.tensors:
        want["output.weight"] = (V, H)
    shapes = layer_shapes(a, gf.tensors, H, I, heads, kv, hd)
    for i in range(n_layers):
        for name, shape in shapes.items():
            want[f"blk.{i}.{name}.weight"] = shape
    for name, shape in want.items():
        t = gf.tensors.get(name)
        if t is None:
            raise GgufError(f"{gf.path}: tensor {name} missing (metadata: {n_layers} layers)")
        if t.shape != shape:
            raise GgufError(f"{gf.path}: tensor {name} has shape {list(t.shape)} but the metadata "
                            f"(hidden {H}, ffn {I}, heads {heads}/{kv} x {hd}) implies {list(shape)}")
    extra = sorted(n for n in gf.tensors if n.startswith(f"blk.{n_layers}."))
    if extra:
        raise GgufError(f"{gf.path}: tensor {extra[0]} beyond block_count {n_layers}")
