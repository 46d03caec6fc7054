"""Tiny random-weight GGUF files for tests: a byte-level BPE tokenizer in the metadata (so the
engine can load them) and every matrix in one quantization type (K-quants as random raw blocks
with small finite scales, which the ``gguf`` package cannot quantize)."""

from __future__ import annotations

import numpy as np

from agentlang.runtime.quant.kquant import BLOCK_BYTES

L = 2
SMALL = (64, 128, 4, 2, 16)          # hidden, ffn, heads, kv heads, head dim
K_DIMS = (256, 512, 4, 2, 64)        # K-quant blocks hold 256 weights: rows of 256 multiples
D_OFFSETS = {"Q6_K": (208,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q3_K": (108,),
             "Q2_K": (80, 82), "Q5_0": (0,), "Q5_1": (0, 2)}              # where a K-quant block keeps its fp16 scales
BLOCK = {"Q5_0": 32, "Q5_1": 32}        # weights a block (else a super-block of 256)


def random_blocks(qtype: str, N: int, K: int, seed: int = 0, scale=(1e-3, 1e-2)) -> np.ndarray:
    """Raw rows of random super-blocks whose float16 scales are finite (uniform in ``scale``)."""
    rng = np.random.default_rng(seed)
    nb = K // BLOCK.get(qtype, 256)
    raw = rng.integers(0, 256, (N, nb, BLOCK_BYTES[qtype]), dtype=np.uint8)
    d = rng.uniform(*scale, (N, nb, 1)).astype(np.float16).view(np.uint8)
    for at in D_OFFSETS[qtype]:
        raw[..., at:at + 2] = d
    return raw.reshape(N, -1)


def byte_level_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte (its byte-level BPE alphabet)."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def gguf_tokenizer_fields() -> dict:
    """A tiny byte-level BPE vocabulary (bytes + a few merges + two specials), written the way
    llama.cpp writes a gpt2-style tokenizer."""
    sym = byte_level_symbols()
    merges = ["Ġ t", "h e", "Ġt he", "i n", "e r"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + sym + \
        ["Ġt", "he", "Ġthe", "in", "er"]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(tokens) - 3),
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 0,
            "tokenizer.ggml.eos_token_id": 2}


def add_tokenizer(w, fields: dict) -> None:
    """Write ``fields`` (:func:`gguf_tokenizer_fields`' keys) into GGUFWriter ``w``."""
    setters = {"model": w.add_tokenizer_model, "pre": w.add_tokenizer_pre,
               "tokens": w.add_token_list, "token_type": w.add_token_types,
               "merges": w.add_token_merges, "bos_token_id": w.add_bos_token_id,
               "eos_token_id": w.add_eos_token_id, "tokenizer.chat_template": w.add_chat_template}
    for k, val in fields.items():
        setters.get(k, setters.get(k.removeprefix("tokenizer.ggml.")))(val)


def write_gguf(path, fields, qtype="Q4_1", arch="llama", embed_type=None, tied=True, seed=0,
               shapes=None, dims=SMALL, types=None, context=256):
    """A random ``arch`` model with every matrix in ``qtype`` (K-quants: random raw blocks),
    but those named in ``types`` ({"attn_v": "Q6_K", ...}: a Q4_K_M-like mix), of ``context``
    positions."""
    import gguf
    from gguf import GGMLQuantizationType as T

    H, I, NH, NKV, HD = dims
    rng = np.random.default_rng(seed)
    vocab = len(fields["tokenizer.ggml.tokens"])
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(L)
    w.add_context_length(context)
    w.add_embedding_length(H)
    w.add_feed_forward_length(I)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    add_tokenizer(w, fields)

    def mat(name, rows, cols, t):
        t = (types or {}).get(name.split(".")[-2], t)
        x = (rng.standard_normal((rows, cols)) * 0.08).astype(np.float32)
        gt = T[t]
        if t not in ("F32", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
            # K-/IQ-quants: the gguf package cannot quantize them; random blocks, small scales
            blk, nbytes = gguf.GGML_QUANT_SIZES[gt]
            raw = rng.integers(0, 256, (rows, cols // blk, nbytes), dtype=np.uint8)
            d = rng.uniform(1e-5, 1e-4, (rows, cols // blk, 1)).astype(np.float16).view(np.uint8)
            for at in D_OFFSETS.get(t, (0,)):
                raw[..., at:at + 2] = d
            w.add_tensor(name, raw.reshape(rows, -1), raw_dtype=gt)
        elif t == "F32":
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, gguf.quants.quantize(x, gt), raw_dtype=gt)

    sh = dict(shapes or {})
    mat("token_embd.weight", vocab, H, embed_type or qtype)
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    if not tied:
        mat("output.weight", vocab, H, qtype)
    for i in range(L):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
        w.add_tensor(p + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
        mat(p + "attn_q.weight", *sh.get("attn_q", (NH * HD, H)), qtype)
        mat(p + "attn_k.weight", NKV * HD, H, qtype)
        mat(p + "attn_v.weight", NKV * HD, H, qtype)
        mat(p + "attn_output.weight", H, NH * HD, qtype)
        mat(p + "ffn_gate.weight", I, H, qtype)
        mat(p + "ffn_up.weight", I, H, qtype)
        mat(p + "ffn_down.weight", H, I, qtype)
        if arch == "qwen2":
            for n, rows in (("q", NH * HD), ("k", NKV * HD), ("v", NKV * HD)):
                w.add_tensor(f"{p}attn_{n}.bias", (0.05 * rng.standard_normal(rows)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
