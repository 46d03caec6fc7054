"""The loaded native library (``QMatmulLibrary``: ctypes signatures and torch-tensor wrappers
of its entry points) and the structures its entry points take (``QWeight``: ``agl_qweight``,
``PagedDecode``: ``agl_paged``; ``qmatmul.h``). Which build is loaded: ``__init__.py``."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from agentlang.runtime.quant.native.kinds import K_KINDS

if TYPE_CHECKING:
    from agentlang.runtime.quant.native import Isa


class QWeight(ctypes.Structure):
    """``agl_qweight``: one quantized weight's pointers (the tensors must outlive it)."""

    _fields_ = [("kind", ctypes.c_int32), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("kb", ctypes.c_int64), ("qs", ctypes.c_void_p), ("d", ctypes.c_void_p), ("m", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("sc", ctypes.c_void_p), ("mn", ctypes.c_void_p),
                ("hb", ctypes.c_void_p), ("next", ctypes.c_void_p)]

    @classmethod
    def of(cls, kind: int, k: int, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None,
           bias: torch.Tensor | None, sc: torch.Tensor | None = None,
           mn: torch.Tensor | None = None, hb: torch.Tensor | None = None, *,
           n: int | None = None, kb: int | None = None) -> "QWeight":
        """k: in features; rows of ``kb`` blocks (even, zero-padded): qs Q4 uint8
        ``[N, kb*16]`` / Q8 int8 ``[N, kb*32]``; d, m float16 ``[N, kb]`` (m: Q4_1 only);
        bias float32 ``[N]``; all contiguous. K-quants (``kquant.h``): d, m a super-block,
        sc, mn, hb their layouts. ``n``, ``kb`` where ``d`` is not ``[N, kb]`` (panels)."""
        n = d.shape[0] if n is None else n
        kb = (k // 32 if kind in K_KINDS else d.shape[1]) if kb is None else kb
        return cls(kind, n, k, kb, qs.data_ptr(), d.data_ptr(), _ptr(m), _ptr(bias), _ptr(sc),
                   _ptr(mn), _ptr(hb))


class PagedDecode(ctypes.Structure):
    """``agl_paged``: a decode step's view of one layer's KV pool (``paged_attention.c``)."""

    _fields_ = [("B", ctypes.c_int64), ("nh", ctypes.c_int64), ("nkv", ctypes.c_int64),
                ("hd", ctypes.c_int64), ("page_size", ctypes.c_int64),
                ("max_pages", ctypes.c_int64), ("page_table", ctypes.c_void_p),
                ("lens", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
                ("kv_bf16", ctypes.c_int32), ("scale", ctypes.c_float)]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class QMatmulLibrary:
    """The loaded library: :meth:`matmul` runs ``agl_qmatmul``, :meth:`dequantize_bf16`
    ``agl_dequant_bf16`` and :meth:`softmax_lse_` ``agl_softmax_lse`` on torch tensors; ``lib``
    is the ctypes handle for the other entry points (``agentlang.runtime.models.decode_layer``)."""

    def __init__(self, path: Path, isa: Isa):
        self.path, self.isa = path, isa
        self.lib = ctypes.CDLL(str(path))
        self._fn = self.lib.agl_qmatmul
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.POINTER(QWeight), ctypes.c_void_p, ctypes.c_int64,
                             ctypes.c_void_p, ctypes.c_int]
        self._dequant = self.lib.agl_dequant_bf16
        self._dequant.restype = None
        self._dequant.argtypes = [ctypes.POINTER(QWeight), ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_void_p, ctypes.c_int]
        self._paged = self.lib.agl_paged_decode
        self._paged.restype = ctypes.c_int
        self._paged.argtypes = [ctypes.POINTER(PagedDecode), ctypes.c_void_p, ctypes.c_int,
                                ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        self._softmax = self.entry("agl_softmax_lse_causal", None, ctypes.c_void_p, ctypes.c_int,
                                   ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                   ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int)
        v, i64 = ctypes.c_void_p, ctypes.c_int64
        self._merge = self.entry("agl_merge_lse", None, v, v, v, v, i64, i64, i64, i64, i64,
                                 ctypes.c_int, ctypes.c_int)
        self._shared = self.entry("agl_attend_shared_bf16", ctypes.c_int, v, i64, i64, i64, i64,
                                  v, v, i64, i64, i64, i64, ctypes.c_float, v, v, ctypes.c_int)
        self._sample = self.entry("agl_sample_row", ctypes.c_int64, ctypes.c_void_p,
                                  ctypes.c_int64, ctypes.c_float, ctypes.c_double)
        self._bitmask = self.entry("agl_apply_bitmask", None, ctypes.c_void_p, ctypes.c_int64,
                                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                   ctypes.c_int64, ctypes.c_int64)

    def amx_ready(self) -> bool:
        """Whether this process may run the build's AMX tiles (``agl_amx_ready``: asks Linux
        for the permission; False for builds without them)."""
        return self.isa.panels and bool(self.entry("agl_amx_ready", ctypes.c_int)())

    def entry(self, name: str, restype, *argtypes):
        """The C function ``name`` with its ctypes signature set (``restype`` None: void)."""
        fn = getattr(self.lib, name)
        fn.restype, fn.argtypes = restype, list(argtypes)
        return fn

    def matmul(self, w: QWeight, x: torch.Tensor, out_features: int | None = None) -> torch.Tensor:
        """x: float32 contiguous ``[M, K]`` → ``x @ W.T + bias``, float32 ``[M, N]`` (``N``:
        ``out_features``, the sum over a chain of parts; default ``w.n``)."""
        y = torch.empty(x.shape[0], out_features or w.n, dtype=torch.float32)
        rc = self._fn(ctypes.byref(w), x.data_ptr(), x.shape[0], y.data_ptr(), torch.get_num_threads())
        if rc == -2:
            raise ValueError(f"the {self.isa.name} build has no kernel for weight kind {w.kind}")
        if rc != 0:
            raise MemoryError(f"native matmul: no memory to quantize {tuple(x.shape)} activations")
        return y

    def dequantize_bf16(self, w: QWeight, rows: range | None = None) -> torch.Tensor:
        """Weight rows ``rows`` (default all) as bfloat16 ``[len(rows), K]``: each value
        computed in float32 from its block and rounded to nearest even (what
        ``.to(torch.bfloat16)`` of the exact weight gives)."""
        rows = range(w.n) if rows is None else rows
        if rows.step != 1 or not 0 <= rows.start <= rows.stop <= w.n:
            raise ValueError(f"rows must be a consecutive range within 0..{w.n}, got {rows}")
        out = torch.empty(len(rows), w.k, dtype=torch.bfloat16)
        self._dequant(ctypes.byref(w), rows.start, rows.stop, out.data_ptr(),
                      torch.get_num_threads())
        return out

    def paged_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     pages: torch.Tensor, lens: torch.Tensor, scale: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode attention read through page tables (``agl_paged_decode``).

        q: [B, Hq, D] float32 or bfloat16; k, v: one layer's pool [P, S, Hkv, D] (float32 or
        bfloat16, contiguous); pages: int64 [B, n] each row's pages in order; lens: int64 [B]
        keys of each row (1..n*S). Returns out [B, Hq, D] in q's dtype and lse [B, Hq] float32,
        as ``cascade.attend_lse`` gives them (the arithmetic in float32)."""
        B, Hq, D = q.shape
        dtypes = (torch.float32, torch.bfloat16)
        if q.dtype not in dtypes or k.dtype not in dtypes or v.dtype != k.dtype:
            raise ValueError(f"q, k, v must be float32 or bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}")
        q = q.contiguous()
        pages, lens = pages.contiguous(), lens.contiguous()
        if pages.dtype != torch.int64 or lens.dtype != torch.int64 or pages.shape[0] != B:
            raise ValueError("pages [B, n] and lens [B] must be int64")
        out = torch.empty_like(q)
        lse = torch.empty(B, Hq, dtype=torch.float32)
        desc = PagedDecode(B, Hq, k.shape[2], D, k.shape[1], pages.shape[1], pages.data_ptr(),
                           lens.data_ptr(), k.data_ptr(), v.data_ptr(),
                           int(k.dtype == torch.bfloat16), scale)
        bf16 = int(q.dtype == torch.bfloat16)
        rc = self._paged(ctypes.byref(desc), q.data_ptr(), bf16, out.data_ptr(), bf16,
                         lse.data_ptr(), torch.get_num_threads())
        if rc == -2:
            raise ValueError(f"paged_decode: lens must be in 1..{pages.shape[1] * k.shape[1]} "
                             f"and {Hq} query heads a multiple of {k.shape[2]} KV heads")
        if rc != 0:
            raise MemoryError("paged_decode: no memory for the scores")
        return out, lse

    @staticmethod
    def mergeable(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor) -> bool:
        """Whether :meth:`merge_lse_` takes these: o1 [M, H, G, D] and l1 [M, H, G] contiguous,
        o2 / l2 of those shapes stored [H, M2 >= M, ...] (transposed views of one matmul's
        result, or their first rows), float32 or bfloat16 outputs alike, float32 lse."""
        if o1.dim() != 4 or o2.shape != o1.shape or l1.shape != o1.shape[:3]:
            return False
        M, H, G, D = o1.shape
        o2t, l2t = o2.transpose(0, 1), l2.transpose(0, 1)      # [H, M, G, D] views of [H, M2, ..]
        M2 = o2t.stride(0) // (G * D) if G * D else 0
        return (l2.shape == l1.shape and o1.dtype in (torch.float32, torch.bfloat16)
                and o2.dtype == o1.dtype and l1.dtype == l2.dtype == torch.float32
                and o1.is_contiguous() and l1.is_contiguous() and M2 >= M
                and o2t.stride() == (M2 * G * D, G * D, D, 1) and l2t.stride() == (M2 * G, G, 1))

    def merge_lse_(self, o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor,
                   l2: torch.Tensor) -> torch.Tensor:
        """``cascade.merge_lse`` in place on o1 (``agl_merge_lse``): o1 [M, H, G, D] with lse
        l1 [M, H, G] becomes the attention over its keys and those of o2, l2 (the layouts
        :meth:`mergeable` names: ``attend_shared``'s result, or its first rows). Returns o1."""
        if not self.mergeable(o1, l1, o2, l2):
            raise ValueError("merge_lse_: o1 [M, H, G, D] and l1 [M, H, G] contiguous, o2 / l2 "
                             "of that shape stored [H, M2 >= M, ...], float32 or bfloat16 "
                             "outputs, float32 lse")
        M, H, G, D = o1.shape
        o2t, l2t = o2.transpose(0, 1), l2.transpose(0, 1)
        self._merge(o1.data_ptr(), l1.data_ptr(), o2t.data_ptr(), l2t.data_ptr(), M, H, G, D,
                    o2t.stride(0) // (G * D), int(o1.dtype == torch.bfloat16),
                    torch.get_num_threads())
        return o1

    def attend_shared_bf16(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           scale: float, causal: tuple[int, int] | None = None,
                           out: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Every row of q against one K/V [L, H, D] (each key's heads contiguous, keys any
        stride apart), all bfloat16, on AMX tiles (``shared_attention.c``). q: [H, R, D], or
        [T, H, G, D] (tokens first: head h's rows are (t, g), R = T G, a prefill's own layout,
        not transposed); out in q's shape and bfloat16 (written into ``out`` when given: a
        contiguous tensor of q's shape) and lse [H, R] float32, as ``cascade.attend_lse``
        gives them; ``causal`` (n, G): ``cascade.CausalTail(n, G)`` over the last n keys
        (R = n G). None where this build or CPU has no bf16 tiles or D is not 64 / 128."""
        H, D = q.shape[-3] if q.dim() == 4 else q.shape[0], q.shape[-1]
        R, qg = (q.shape[0] * q.shape[2], q.shape[2]) if q.dim() == 4 else (q.shape[1], 0)
        cn, cg = causal or (0, 0)
        if causal is not None and (not 0 < cn <= k.shape[0] or cg < 1 or R != cn * cg):
            raise ValueError(f"attend_shared_bf16: causal (n, G) must have 0 < n <= "
                             f"{k.shape[0]} keys and n * G == {R} rows, got {causal}")
        out = torch.empty_like(q) if out is None else out
        if (q.dim() not in (3, 4) or q.dtype != torch.bfloat16 or k.dtype != q.dtype
                or v.dtype != q.dtype or k.shape != (k.shape[0], H, D) or v.shape != k.shape
                or k.stride() != v.stride() or k.stride()[1:] != (D, 1) or not q.is_contiguous()
                or out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous()):
            raise ValueError("attend_shared_bf16: q [H, R, D] or [T, H, G, D] contiguous, k / v "
                             "[L, H, D] with each key's heads contiguous, out like q, all "
                             "bfloat16")
        lse = torch.empty(H, R, dtype=torch.float32)
        rc = self._shared(q.data_ptr(), H, R, qg, D, k.data_ptr(), v.data_ptr(), k.shape[0],
                          k.stride(0), cn, cg, scale, out.data_ptr(), lse.data_ptr(),
                          torch.get_num_threads())
        if rc == -1:
            raise MemoryError("attend_shared_bf16: no memory for the packed keys")
        return (out, lse) if rc == 0 else None

    def sample_row(self, logits: torch.Tensor, temperature: float, u: float) -> int:
        """The token of ``softmax(logits / temperature)`` at uniform number ``u`` in [0, 1)
        (``sample.c``: the inverse of the running sum; a -inf logit is never drawn).
        logits: float32 ``[V]``, contiguous, on the CPU; ``ValueError`` when every logit is
        -inf."""
        if logits.dtype != torch.float32 or logits.dim() != 1 or not logits.is_contiguous():
            raise ValueError(f"logits must be contiguous float32 [V], got {logits.dtype} "
                             f"{tuple(logits.shape)}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        tok = self._sample(logits.data_ptr(), logits.shape[0], temperature, u)
        if tok == -1:
            raise ValueError("every logit is -inf: no token can be drawn")
        if tok < 0:
            raise ValueError(f"sample_row: a vocabulary of {logits.shape[0]} tokens is beyond "
                             "the 4M sample.c takes")
        return tok

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: int,
                      rows: Sequence[int] | None) -> None:
        """A grammar :data:`~agentlang.runtime.grammar.base.BitmaskKernel` (``sample.c``): in
        ``rows`` (all when None) of ``logits [N, V' >= V]`` (float32, CPU, unit stride within a
        row), the tokens ``< vocab_size`` whose bit is 0 in ``bitmask [>= N, ceil(V/32)]``
        (int32, contiguous) become -inf, in place."""
        if (logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1
                or bitmask.dtype != torch.int32 or not bitmask.is_contiguous()
                or bitmask.shape[1] * 32 < vocab_size or logits.shape[1] < vocab_size):
            raise ValueError("apply_bitmask: float32 logits [N, V'] (rows of unit stride) and a "
                             "contiguous int32 bitmask [N, ceil(V/32)]")
        idx = None if rows is None else torch.tensor(list(rows), dtype=torch.int64)
        n = logits.shape[0] if idx is None else idx.numel()
        self._bitmask(logits.data_ptr(), logits.stride(0), bitmask.data_ptr(), bitmask.shape[1],
                      None if idx is None else idx.data_ptr(), n, vocab_size)

    def softmax_lse_(self, s: torch.Tensor, scale: float,
                     causal: tuple[int, int] | None = None) -> torch.Tensor:
        """In place: the last dim of ``s`` (float32 or bfloat16, contiguous, on the CPU) becomes
        ``softmax(scale * s)`` (-inf scores give 0); returns the log-sum-exp of ``scale * s``,
        float32, ``s.shape[:-1]``.

        ``causal = (n, G)``: ``s [..., n * G, L]`` is a causal block whose rows are its last
        ``n`` keys' tokens in (token, head) order, G heads a token; row ``i * G + g`` sees keys
        ``0 .. L - n + i`` only, the others get p = 0 without being read (the bits of the same
        scores masked to -inf: ``cascade.CausalTail``'s mask)."""
        if s.dtype not in (torch.float32, torch.bfloat16) or not s.is_contiguous():
            raise ValueError(f"s must be contiguous float32 or bfloat16, got {s.dtype}")
        n, G = causal or (0, 1)
        if causal is not None and not (n >= 1 and G >= 1 and s.dim() >= 2
                                       and s.shape[-2] == n * G and s.shape[-1] >= n):
            raise ValueError(f"causal (n, G) = {causal} needs s [..., n * G, L >= n], got "
                             f"{tuple(s.shape)}")
        lse = torch.empty(s.shape[:-1], dtype=torch.float32)
        self._softmax(s.data_ptr(), int(s.dtype == torch.bfloat16), lse.numel(), s.shape[-1],
                      n, G, scale, lse.data_ptr(), torch.get_num_threads())
        return lse
