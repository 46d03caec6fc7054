"""The native library: the quantized matmul (``qmatmul.c``), a whole decode-step layer
(``decode_layer.c``), bf16 dequantization of a weight's rows (``dequant.c``) and attention's
softmax with its log-sum-exp (``softmax.c``). Built on first use with the system C compiler
into a per-user cache, loaded with ctypes, shared by every :class:`~agentlang.runtime.quant.block_linear.BlockLinear`
and by :func:`agentlang.runtime.attention.cascade.attend_lse`.

Why native: at batch 1 a decode step of a small model is a few dozen matmuls whose torch
kernels (int4 / int8 weight-only, bf16 activations) each cost tens of µs; a loop over the GGUF
blocks with integer dot products (what llama.cpp does) runs the same shapes several times
faster and keeps each block's own scale (Q8_0 included).

Two builds (:data:`ISAS`), the same entry points, the same weight layout and the same
arithmetic contract (activations quantized to 16 bits a block, exact integer block sums, a
row's output independent of the batch and the threads): ``avx512/`` (AVX-512 VNNI: four
``vpdpbusd`` a group of 4 blocks, K-quants read a group at a time by ``kgroups.h``) and
``avx2/`` (AVX2 + FMA + F16C: ``vpmaddwd`` on int16, one path for few rows and one through
packed panels for many), with ``decode_layer.c`` and ``vecmath.h`` shared. The results of the two differ only in the order of float32 sums (the
AVX-512 build sums 16 lanes of partial block sums; the AVX2 one each block's exact sum).

Availability (:func:`qmatmul_library` returns None and says why, once, in the log): the CPU
must report one build's :attr:`Isa.cpu_flags` (the first that fits is taken), a C compiler
(``$CC``, else ``cc``/``gcc``) must build the source, and ``AGENTLANG_NATIVE`` must not be
``0``; ``AGENTLANG_NATIVE=avx2`` (or ``avx512``) asks for that build (an AVX-512 machine can run
the AVX2 one). Without it the loader keeps torch's kernels (``agentlang.runtime.quant.quant_linear``)
and attention torch's softmax. The build takes ~1 s, at model load (never on a request), and
is reused across processes: the cache key is the source, the flags and the compiler's version
(``$XDG_CACHE_HOME/agentlang/native`` or ``~/.cache/agentlang/native``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from agentlang.runtime.quant.native.cpu_features import cpu_flags

HERE = Path(__file__).parent
SHARED = ("qmatmul.h", "vecmath.h", "kdequant.h", "decode_layer.c", "paged_attention.c",
          "glue.c", "int8.c")     # in this folder, used by every build
OWN = ("qmatmul.c", "dequant.c", "softmax.c")             # in each build's folder
COMMON_CFLAGS = ("-O3", "-fopenmp", "-fPIC", "-shared")
KIND_Q4, KIND_Q8 = 4, 8
KIND_Q5 = 5                                       # Q5_0 / Q5_1 blocks (kquant.h)
KIND_Q4_K, KIND_Q5_K, KIND_Q6_K = 14, 15, 16      # K-quant super-blocks (kquant.h)
K_KINDS = (KIND_Q5, KIND_Q4_K, KIND_Q5_K, KIND_Q6_K)   # the kinds of kquant.h's builds


@dataclass(frozen=True)
class Isa:
    """One build of the library: its folder (``name``) of :data:`OWN` sources and the
    ``headers`` they include, the CPU flags (``/proc/cpuinfo``) it needs and the compiler flags
    that enable them. ``kquants``: the build multiplies K-quant super-blocks and chains of
    weights (its headers include its K-quant reader: ``kquant.h``, ``kgroups.h``); others leave
    K-quant tensors to be decoded by the loader."""

    name: str
    cpu_flags: tuple[str, ...]
    cflags: tuple[str, ...]
    kquants: bool = False
    headers: tuple[str, ...] = ()

    def sources(self) -> tuple[Path, ...]:
        return (*(HERE / n for n in SHARED), *(HERE / self.name / n for n in (*OWN, *self.headers)))

    def missing(self, flags: frozenset[str]) -> list[str]:
        return [f for f in self.cpu_flags if f not in flags]


ISAS = (   # best first
    Isa("avx512", ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "f16c"),
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mf16c"),
        kquants=True, headers=("kgroups.h",)),
    Isa("avx2", ("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c"), kquants=True,
        headers=("kquant.h", "blocks.h", "qact.h", "rows.h", "panel.h")),
)

_log = logging.getLogger(__name__)


class QWeight(ctypes.Structure):
    """``agl_qweight``: one quantized weight's pointers (the tensors must outlive it)."""

    _fields_ = [("kind", ctypes.c_int32), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("kb", ctypes.c_int64), ("qs", ctypes.c_void_p), ("d", ctypes.c_void_p), ("m", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("sc", ctypes.c_void_p), ("mn", ctypes.c_void_p),
                ("hb", ctypes.c_void_p), ("next", ctypes.c_void_p)]

    @classmethod
    def of(cls, kind: int, k: int, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None,
           bias: torch.Tensor | None, sc: torch.Tensor | None = None,
           mn: torch.Tensor | None = None, hb: torch.Tensor | None = None) -> "QWeight":
        """k: in features; rows of ``kb`` blocks (even, zero-padded): qs Q4 uint8
        ``[N, kb*16]`` / Q8 int8 ``[N, kb*32]``; d, m float16 ``[N, kb]`` (m: Q4_1 only);
        bias float32 ``[N]``; all contiguous. K-quants (``kquant.h``): d, m a super-block,
        sc, mn, hb their layouts."""
        n = d.shape[0]
        kb = k // 32 if kind in K_KINDS else d.shape[1]
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
        self._softmax = self.lib.agl_softmax_lse
        self._softmax.restype = None
        self._softmax.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_float, ctypes.c_void_p, ctypes.c_int]


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

    def softmax_lse_(self, s: torch.Tensor, scale: float) -> torch.Tensor:
        """In place: the last dim of ``s`` (float32 or bfloat16, contiguous, on the CPU) becomes
        ``softmax(scale * s)`` (-inf scores give 0); returns the log-sum-exp of ``scale * s``,
        float32, ``s.shape[:-1]``."""
        if s.dtype not in (torch.float32, torch.bfloat16) or not s.is_contiguous():
            raise ValueError(f"s must be contiguous float32 or bfloat16, got {s.dtype}")
        lse = torch.empty(s.shape[:-1], dtype=torch.float32)
        self._softmax(s.data_ptr(), int(s.dtype == torch.bfloat16), lse.numel(), s.shape[-1],
                      scale, lse.data_ptr(), torch.get_num_threads())
        return lse


@functools.cache
def qmatmul_library() -> QMatmulLibrary | None:
    """The library, built if needed, or None where it cannot run here (reason logged)."""
    isa, reason = chosen_isa()
    if isa is not None:
        try:
            return build_library(isa)
        except subprocess.CalledProcessError as e:
            reason = f"build failed: {e.stderr.strip()[-400:]}"
        except OSError as e:
            reason = f"build failed: {e}"
    _log.info("native quantized matmul unavailable (%s): using torch's int4/int8 kernels", reason)
    return None


@functools.cache
def kquant_library() -> QMatmulLibrary | None:
    """The library for a model with K-quant tensors: :func:`qmatmul_library` if its build has
    K-quant kernels, else the best build this CPU runs that has them (an AVX-512 machine runs
    the AVX2 build's), else None. ``AGENTLANG_NATIVE=0`` keeps it None."""
    lib = qmatmul_library()
    if lib is None or lib.isa.kquants:
        return lib
    for isa in runnable_isas():
        if isa.kquants:
            try:
                return build_library(isa)
            except (subprocess.CalledProcessError, OSError) as e:
                _log.info("the %s build (K-quant kernels) failed: %s", isa.name, e)
    return None


def build_library(isa: Isa) -> QMatmulLibrary:
    """``isa``'s build, compiled if needed (the caller checks that the CPU runs it)."""
    return QMatmulLibrary(_build(isa), isa)


def unavailable_reason() -> str | None:
    """Why the native kernels cannot run here (None if they can, given a successful build)."""
    return chosen_isa()[1]


def runnable_isas() -> tuple[Isa, ...]:
    """The builds this CPU can run, best first (whatever ``AGENTLANG_NATIVE`` says)."""
    flags = cpu_flags()
    return tuple(i for i in ISAS if flags and not i.missing(flags))


def chosen_isa() -> tuple[Isa | None, str | None]:
    """The build to use here and None, or None and why there is none."""
    wanted = os.environ.get("AGENTLANG_NATIVE", "1")
    if wanted == "0":
        return None, "AGENTLANG_NATIVE=0"
    names = [i.name for i in ISAS]
    if wanted not in ("1", *names):
        return None, f"AGENTLANG_NATIVE must be 0, 1 or one of {', '.join(names)}, got {wanted!r}"
    flags = cpu_flags()
    if not flags:
        return None, "no /proc/cpuinfo"
    candidates = [i for i in ISAS if wanted in ("1", i.name)]
    for isa in candidates:
        if not isa.missing(flags):
            if _compiler() is None:
                return None, "no C compiler (set CC)"
            return isa, None
    return None, "the CPU lacks " + "; or ".join(" ".join(i.missing(flags)) for i in candidates)


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def compile_library(isa: Isa, out: Path, defines: tuple[str, ...] = ()) -> None:
    """Compile ``isa``'s build into ``out`` (uncached), with extra ``-D`` ``defines`` for a
    variant (``bench/native_variants.py``); raises ``CalledProcessError`` with the compiler's
    output."""
    subprocess.run([_compiler(), *COMMON_CFLAGS, *isa.cflags, *defines, f"-I{HERE}", "-o",
                    str(out), *(str(p) for p in isa.sources() if p.suffix == ".c"), "-lm"],
                   check=True, capture_output=True, text=True)


def _build(isa: Isa) -> Path:
    cc = _compiler()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    sources = isa.sources()
    cflags = (*COMMON_CFLAGS, *isa.cflags)       # the key; the include path is not (install-specific)
    texts = [p.read_text() for p in sources]
    key = hashlib.sha256("\0".join([isa.name, *texts, *cflags, version]).encode()).hexdigest()[:16]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    out = base / "agentlang" / "native" / key / "libqmatmul.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            compile_library(isa, Path(tmp))
            os.replace(tmp, out)          # atomic: concurrent builders leave one whole file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return out
