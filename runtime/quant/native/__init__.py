"""The native library: the quantized matmul (``qmatmul.c``), a whole decode-step layer
(``decode_layer.c``), bf16 dequantization of a weight's rows (``dequant.c``) and attention's
softmax with its log-sum-exp (``softmax.c``). Built on first use with the system C compiler
into a per-user cache, loaded with ctypes, shared by every :class:`~agentlang.runtime.quant.block_linear.BlockLinear`
and by :func:`agentlang.runtime.attention.cascade.attend_lse`.

Why native: at batch 1 a decode step of a small model is a few dozen matmuls whose torch
kernels (int4 / int8 weight-only, bf16 activations) each cost tens of µs; a loop over the GGUF
blocks with integer dot products (what llama.cpp does) runs the same shapes several times
faster and keeps each block's own scale (Q8_0 included).

Three builds (:data:`ISAS`), the same entry points and the same arithmetic contract
(activations quantized to 16 bits a block, exact integer block sums, a row's output independent
of the batch and the threads): ``avx512/`` (AVX-512 VNNI: four ``vpdpbusd`` a group of 4
blocks, K-quants read a group at a time by ``kgroups.h``), ``amx`` (the same sources with
``-DAGL_AMX``: Q4 / Q5 / Q8 / Q4_K / Q6_K weights stored in panels of 16 rows,
``avx512/panel.h``, multiplied by AMX tiles for calls of 9 rows or more (8-bit kinds: 4) and by VNNI
(``vpdpwssd`` on the 16-bit activations) with a weight row a lane below that; Q5_K as ``avx512``) and ``avx2/`` (AVX2 + FMA + F16C: ``vpmaddwd`` on int16, one path
for few rows and one through packed panels for many), with ``decode_layer.c`` and
``vecmath.h`` shared. Their results differ only in the order of float32 sums (the AVX-512
build sums 16 lanes of partial block sums; the AVX2 and AMX ones each block's exact sum). The
weight layout is the build's (:attr:`Isa.panels`; ``block_linear.py`` stores it).

Availability (:func:`qmatmul_library` returns None and says why, once, in the log): the CPU
must report one build's :attr:`Isa.cpu_flags` (the first that fits is taken), a C compiler
(``$CC``, else ``cc``/``gcc``) must build the source, and ``AGENTLANG_NATIVE`` must not be
``0``; ``AGENTLANG_NATIVE=avx2`` (or ``avx512``, ``amx``) asks for that build (an AVX-512 machine can run
the AVX2 one). Without it the loader keeps torch's kernels (``agentlang.runtime.quant.quant_linear``)
and attention torch's softmax. The build takes ~1 s, at model load (never on a request), and
is reused across processes: the cache key is the source, the flags and the compiler's version
(``$XDG_CACHE_HOME/agentlang/native`` or ``~/.cache/agentlang/native``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agentlang.runtime.quant.native.cpu_features import cpu_flags
from agentlang.runtime.quant.native.kinds import (K_KINDS, KIND_Q4, KIND_Q4_K, KIND_Q5,  # noqa: F401
                                                  KIND_Q5_K, KIND_Q6_K, KIND_Q8)
from agentlang.runtime.quant.native.library import PagedDecode, QMatmulLibrary, QWeight  # noqa: F401

HERE = Path(__file__).parent
SHARED = ("qmatmul.h", "vecmath.h", "kdequant.h", "softmax_rows.h", "decode_attention.h",
          "attention_phases.h", "attention_kv.h",
          "decode_layer.c", "paged_attention.c", "shared_attention.c", "glue.c", "int8.c", "sample.c")     # in this folder, used by every build
OWN = ("qmatmul.c", "dequant.c", "softmax.c")             # in each build's folder
COMMON_CFLAGS = ("-O3", "-fopenmp", "-fPIC", "-shared")


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
    folder: str = ""        # the sources' folder when not ``name`` (a variant of another build)
    panels: bool = False    # Q4 / Q8 weights in panels of 16 rows (avx512/panel.h; block_linear)

    def sources(self) -> tuple[Path, ...]:
        own = HERE / (self.folder or self.name)
        return (*(HERE / n for n in SHARED), *(own / n for n in (*OWN, *self.headers)))

    def missing(self, flags: frozenset[str]) -> list[str]:
        return [f for f in self.cpu_flags if f not in flags]


AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "f16c")
AVX512_CFLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mf16c")
ISAS = (   # best first
    Isa("amx", (*AVX512_FLAGS, "amx_tile", "amx_int8"),
        (*AVX512_CFLAGS, "-mamx-tile", "-mamx-int8", "-DAGL_AMX"), kquants=True,
        headers=("kgroups.h", "panel.h"), folder="avx512", panels=True),
    Isa("avx512", AVX512_FLAGS, AVX512_CFLAGS, kquants=True, headers=("kgroups.h",)),
    Isa("avx2", ("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c"), kquants=True,
        headers=("kquant.h", "blocks.h", "qact.h", "rows.h", "panel.h")),
)

_log = logging.getLogger(__name__)


@functools.cache
def qmatmul_library() -> QMatmulLibrary | None:
    """The library, built if needed, or None where it cannot run here (reason logged). A build
    that fails to compile, or whose AMX tiles Linux refuses, gives way to the next one the CPU
    runs (unless ``AGENTLANG_NATIVE`` named it)."""
    isa, reason = chosen_isa()
    while isa is not None:
        try:
            lib = build_library(isa)
            if not isa.panels or lib.amx_ready():
                return lib
            reason = "Linux refused the AMX tile permission"
        except subprocess.CalledProcessError as e:
            reason = f"build failed: {e.stderr.strip()[-400:]}"
        except OSError as e:
            reason = f"build failed: {e}"
        _log.info("the %s build cannot run (%s): taking the next build", isa.name, reason)
        isa, _ = chosen_isa(after=isa)             # none left: the failure is the reason
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


def chosen_isa(after: Isa | None = None) -> tuple[Isa | None, str | None]:
    """The build to use here and None, or None and why there is none (``after``: a build
    that cannot run after all; the next one that fits)."""
    wanted = os.environ.get("AGENTLANG_NATIVE", "1")
    if wanted == "0":
        return None, "AGENTLANG_NATIVE=0"
    names = [i.name for i in ISAS]
    if wanted not in ("1", *names):
        return None, f"AGENTLANG_NATIVE must be 0, 1 or one of {', '.join(names)}, got {wanted!r}"
    flags = cpu_flags()
    if not flags:
        return None, "no /proc/cpuinfo"
    candidates = [i for i in ISAS[ISAS.index(after) + 1 if after else 0:]
                  if wanted in ("1", i.name)]
    for isa in candidates:
        if not isa.missing(flags):
            if _compiler() is None:
                return None, "no C compiler (set CC)"
            return isa, None
    if not candidates:
        return None, f"AGENTLANG_NATIVE={wanted} and that build cannot run here"
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
