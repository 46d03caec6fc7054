"""Decode steps in one native call per layer (``runtime/quant/native/decode_layer.c``).

At batch 1 a decode step of a small quantized model is ~45 small torch ops per layer (norms,
matmuls, RoPE, the KV store, attention, residuals); each costs a few µs of dispatch, more than
the arithmetic. :class:`NativeDecoder` runs every layer of a step in one C call instead
(``agl_decode_layers``), with the same arithmetic in float32 (see the C file). It returns
between two layers only while the engine has an arrival pending (the step's layer-break hook
then runs, and the call resumes): a call a layer cost ~20 µs of Python each (the pool's
pointers, the interpreter lock taken back), ~0.6 ms of a ~5 ms one-row step.

It serves a step when (:meth:`NativeDecoder.serves`): every sequence appends at most
:data:`MAX_ROWS` tokens (a decode, a speculative or jump-forward verify, a prefill chunk of
up to the default ``max_batch_tokens``), fewer rows in all than the engine's
``bf16_gemm_rows`` when that is set (those calls are bf16 GEMMs, the torch layers'), the
attention backend is torch's (CPU), the KV pool stores float32 or bfloat16 (``kv_dtype``
``"bfloat16"``: each K/V value rounded once, as it is stored) unquantized, and no
sequences share enough leading pages for a cascade group to pay (the torch backend reads a
long prefix shared by many sequences once for the whole group — cascade attention — where
this path reads it once per sequence; :func:`~agentlang.runtime.attention.decode_plan.cascade_min_keys`);
otherwise the model's layers run as usual. A sequence appending ``n`` tokens runs as ``n`` rows, row ``j``
attending to its first ``prefix + j + 1`` positions through the sequence's page table (every
row's K/V is stored before any row attends): each row gets exactly the arithmetic of a decode
step at its position, so verifying a draft gives the logits one-token steps would give,
bitwise. Gemma 2 / 3 layers run here too (sandwich norms, GeGLU, sliding windows, score caps,
their attention scale and the sliding layers' RoPE table; see the C file). It is built by the
GGUF loader when every layer's linears are
:class:`~agentlang.runtime.quant.block_linear.BlockLinear` and the activations are float32.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from agentlang.runtime.attention.decode_plan import (cascade_min_keys, decode_plan,
                                                     shared_prefix_groups)
from agentlang.runtime.quant.block_linear import BlockLinear
from agentlang.runtime.attention.forward_batch import ForwardBatch
from agentlang.runtime.cache.kv_pool import KVPool
from agentlang.runtime.quant.native import QMatmulLibrary, QWeight


# tokens a sequence may append in a natively run step: decodes, verifies and prefill chunks up
# to the default max_batch_tokens. A prefill chunk here rather than in the torch layers (rows
# attended in tasks of a KV head's queries, each key read once a task; no gathered copies): 512
# new tokens -26 %, 2048 -21 %, 64 over 2400 cached -30 %, 150 over 2400 -4 % (embedded model,
# float32, 2-core AMX Xeon, both paths alternated in one process); each row gets a decode's
# arithmetic, so a prompt's K/V no longer depends on how it was chunked.
MAX_ROWS = 2048


class Dims(ctypes.Structure):
    _fields_ = [("hidden", ctypes.c_int64), ("nh", ctypes.c_int64), ("nkv", ctypes.c_int64),
                ("hd", ctypes.c_int64), ("inter", ctypes.c_int64), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float), ("rd", ctypes.c_int64), ("softcap", ctypes.c_float),
                ("gelu", ctypes.c_int64)]


class Layer(ctypes.Structure):
    _fields_ = [("attn_norm", ctypes.c_void_p), ("ffn_norm", ctypes.c_void_p),
                ("qkv", QWeight), ("o", QWeight), ("gate_up", QWeight), ("down", QWeight),
                ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p),
                ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
                ("post_attn_norm", ctypes.c_void_p), ("post_ffn_norm", ctypes.c_void_p),
                ("window", ctypes.c_int64), ("local_rope", ctypes.c_int64),
                ("kv_bf16", ctypes.c_int64)]


class Batch(ctypes.Structure):
    _fields_ = [("B", ctypes.c_int64), ("cos", ctypes.c_void_p), ("ssin", ctypes.c_void_p),
                ("slots", ctypes.c_void_p), ("page_table", ctypes.c_void_p),
                ("max_pages", ctypes.c_int64), ("page_size", ctypes.c_int64),
                ("seq_lens", ctypes.c_void_p), ("lcos", ctypes.c_void_p),
                ("lssin", ctypes.c_void_p), ("wslots", ctypes.c_void_p),
                ("wpage_table", ctypes.c_void_p)]


class NativeDecoder:
    """Runs the layers of decode steps natively for one model (module doc)."""

    def __init__(self, lib: QMatmulLibrary, model: torch.nn.Module):
        cfg = model.config
        self.dims = Dims(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.intermediate_size, cfg.rms_norm_eps,
                         cfg.attn_scale or cfg.head_dim ** -0.5, cfg.rope_dim,
                         cfg.attn_softcap, int(cfg.hidden_act == "gelu_tanh"))
        layers = []
        self.keep = []                     # the tensors the structs point into
        self.linear = model.layers[0].self_attn.qkv_proj   # its bf16_gemm_rows: the engine's
        local = int(model.local_rope is not None)
        for layer in model.layers:
            lins = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                    layer.mlp.down_proj)
            attn = layer.self_attn
            qk = (attn.q_norm, attn.k_norm) if cfg.qk_norm else ()
            # Gemma: the norm before the MLP is pre_feedforward_layernorm; two norms after
            pre, post = ((layer.pre_feedforward_layernorm, (layer.post_attention_layernorm,
                                                            layer.post_feedforward_layernorm))
                         if layer.sandwich else (layer.post_attention_layernorm, ()))
            norms = [n.weight.detach().float().contiguous()
                     for n in (layer.input_layernorm, pre, *qk, *post)]
            self.keep += [*norms, *lins]
            ptrs = [t.data_ptr() for t in norms]
            qk_ptrs = ptrs[2:2 + len(qk)] or [None, None]
            post_ptrs = ptrs[2 + len(qk):] or [None, None]
            layers.append(Layer(ptrs[0], ptrs[1], *(lin.qweight for lin in lins), None,
                                None, *qk_ptrs, *post_ptrs, attn.window,
                                local if attn.window else 0))
        self.layers = (Layer * len(layers))(*layers)   # one array: agl_decode_layers walks it
        self._pool: KVPool | None = None   # the pool the layers' K/V pointers are set for
        self._fn = lib.lib.agl_decode_layers
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.POINTER(Dims), ctypes.POINTER(Layer), ctypes.c_int64,
                             ctypes.c_int64, ctypes.POINTER(Batch), ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_int32), ctypes.c_int]

    @staticmethod
    def eligible(model: torch.nn.Module, dtype: torch.dtype) -> bool:
        """Every layer's linears are :class:`BlockLinear`, activations are float32 and heads
        have at most 512 dimensions (the C layer's RoPE buffer). Qwen3's q/k norms and
        partial rotary are the C layer's too, and Gemma's sandwich norms, GeGLU, windows,
        score caps, attention scale and the sliding layers' RoPE table."""
        cfg = model.config
        return dtype == torch.float32 and cfg.head_dim <= 512 and all(
            isinstance(m, BlockLinear)
            for layer in model.layers
            for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                      layer.mlp.gate_up_proj, layer.mlp.down_proj))

    def serves(self, batch: ForwardBatch, pool: KVPool, backend) -> bool:
        bf16 = self.linear.bf16_gemm_rows
        if not (getattr(backend, "name", None) == "torch" and pool.scales is None
                and pool.layout.dtype == torch.float32 and pool.device.type == "cpu"
                and pool.layout.storage_dtype in (torch.float32, torch.bfloat16)
                and max(batch.extend_lens_list) <= MAX_ROWS
                and (bf16 is None or batch.num_tokens < bf16)):
            return False
        if batch.batch_size == 1:
            return True
        min_keys = cascade_min_keys(torch.float32, True)      # as the backend plans it
        if batch.is_decode:
            plan = batch.cached("torch.decode", lambda: decode_plan(     # the backend's key
                batch.page_table, batch.seq_lens_list, pool.page_size, min_keys))
            return not plan.groups
        return not shared_prefix_groups(batch.page_table, batch.seq_lens_list,
                                        pool.page_size, min_keys, batch.extend_lens_list)[1]

    def step(self, batch: ForwardBatch, pool: KVPool, rope: tuple[torch.Tensor, torch.Tensor],
             local: tuple[torch.Tensor, torch.Tensor] | None = None) -> "NativeStep":
        """The per-step arguments (built once, shared by every layer); ``local``: the sliding
        layers' RoPE rotation when it differs (Gemma 3)."""
        if pool is not self._pool:          # a pool's buffers never move: pointers set once
            bf16 = pool.layout.storage_dtype == torch.bfloat16
            for i, L in enumerate(self.layers):
                L.k_cache, L.v_cache = pool.k_cache(i).data_ptr(), pool.v_cache(i).data_ptr()
                L.kv_bf16 = bf16
            self._pool = pool
        return batch.cached("native.decode", lambda: NativeStep(batch, rope, local, pool))

    def run(self, x: torch.Tensor, step: "NativeStep",
            between_layers: Callable[[], None] | None = None) -> torch.Tensor:
        """Every layer on x: float32 ``[B, hidden]`` (updated in place and returned), in one
        native call. ``between_layers`` (if given) runs between two layers when its
        ``pending`` flag (a ``ctypes.c_int32``, :class:`~agentlang.runtime.engine.layer_break.BetweenLayers`)
        is set, the call then resuming with the next layer; without such a flag, after every
        layer but the last."""
        x = x.contiguous()
        n = len(self.layers)
        pending = getattr(between_layers, "pending", None)
        stop = None if between_layers is None else (
            ctypes.pointer(pending) if pending is not None else ctypes.pointer(ctypes.c_int32(1)))
        i = 0
        while i < n:
            j = self._fn(ctypes.byref(self.dims), self.layers, i, n, ctypes.byref(step.args),
                         x.data_ptr(), stop, torch.get_num_threads())
            if j < 0:
                raise MemoryError(f"native decode layers: out of memory for {x.shape[0]} rows")
            if j < n:
                between_layers()
            i = j
        return x


class NativeStep:
    """A step's batch as ``agl_batch``, one C row a new token (the tensors are kept alive
    here): row ``t`` reads its sequence's page table up to its own position; a windowed pool's
    sliding layers read and write the same through their own pages (``KVPool.window_pages``)."""

    def __init__(self, batch: ForwardBatch, rope: tuple[torch.Tensor, torch.Tensor],
                 local: tuple[torch.Tensor, torch.Tensor] | None = None,
                 pool: KVPool | None = None):
        cos, ssin = (t.reshape(t.shape[0], -1).float().contiguous() for t in rope)   # [T, hd]
        lcos, lssin = (None, None) if local is None else \
            (t.reshape(t.shape[0], -1).float().contiguous() for t in local)
        table, lens = batch.page_table, batch.seq_lens
        if not batch.is_decode:
            seq = torch.repeat_interleave(torch.arange(batch.batch_size),
                                          torch.tensor(batch.extend_lens_list))    # [T]
            table, lens = table.index_select(0, seq.to(table.device)), batch.positions + 1
        self.tensors = (cos, ssin, batch.slot_mapping.long().contiguous(),
                        table.int().contiguous(), lens.int().contiguous())
        c, s, slots, table, lens = self.tensors
        self.local = (lcos, lssin)                        # kept alive with the rest
        self.window = (None, None)
        if pool is not None and pool.windows is not None:
            self.window = (pool.window_slots(slots).contiguous(),
                           pool.window_pages(table).int().contiguous())
        wslots, wtable = self.window
        self.args = Batch(table.shape[0], c.data_ptr(), s.data_ptr(), slots.data_ptr(),
                          table.data_ptr(), table.shape[1], batch.page_size, lens.data_ptr(),
                          None if lcos is None else lcos.data_ptr(),
                          None if lssin is None else lssin.data_ptr(),
                          None if wslots is None else wslots.data_ptr(),
                          None if wtable is None else wtable.data_ptr())
