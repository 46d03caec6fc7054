"""Compile the Triton kernels for an NVIDIA GPU on a machine without one, and report what the
compiler made of each launch: registers per thread, local memory (register spills), shared
memory, how many programs fit on one SM, and which instructions it chose for the loads (TMA,
cp.async pipelining) and the dots (Hopper wgmma, or mma).

Nothing is launched: the wrappers run on CPU tensors with argument checking as usual, and each
kernel launch is compiled for the target instead (Triton's own compiler and its bundled
``ptxas``; ``cuobjdump`` reads the resources back). This catches what the interpreter cannot (a
kernel the GPU compiler rejects, spills, an occupancy cliff) before a GPU is at hand; it says
nothing about speed.

    python bench/kernel_compile.py                 # sm_90 (H100/H200), the default launches
    python bench/kernel_compile.py --sweep         # + every extend sweep candidate
    python bench/kernel_compile.py --arch 80       # A100

Must run without ``TRITON_INTERPRET`` (it switches the compiler off). Exit code 1 when a launch
fails to compile.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

WRAPPER_MODULES = ("agentlang.kernels.decode_attention", "agentlang.kernels.extend_attention", "agentlang.kernels.kv_store",
                   "agentlang.kernels.page_copy")
# one SM of sm_80 (A100) / sm_90 (H100, H200): registers, shared memory, resident programs
SM_REGS = 65536
SM_SHARED = {80: 167936, 90: 233472}
SM_PROGRAMS = 32


@dataclass
class Compiled:
    """One compiled launch: the resources ``cuobjdump`` reports and the chosen instructions."""

    kernel: str
    num_warps: int
    regs: int            # per thread
    local_bytes: int     # per thread: register spills (and stack arrays)
    shared_bytes: int    # static + dynamic, per program
    tma_loads: int
    cp_async_loads: int
    wgmma_dots: int
    mma_dots: int
    ttgir: str = field(default="", repr=False)  # the TritonGPU IR, for a closer look

    def programs_per_sm(self, arch: int) -> int:
        """How many programs registers and shared memory let one SM hold (an estimate: the
        register allocation granularity is ignored)."""
        by_regs = SM_REGS // max(1, self.regs * 32 * self.num_warps)
        by_shared = SM_SHARED[arch] // (self.shared_bytes + 1024)  # 1 KiB reserved per program
        return min(by_regs, by_shared, SM_PROGRAMS)


class CompileOnly:
    """Route every launch of the kernel wrappers to the compiler for ``arch`` (no GPU needed).

    Use as a context manager around wrapper calls on CPU tensors; each launch appends one
    :class:`Compiled` to ``self.compiled`` and the wrapper goes on as if it had launched. Sets
    Triton's active driver to a compile-only one and lifts the wrappers' device check for the
    duration; both are restored on exit."""

    def __init__(self, arch: int = 90):
        from triton.backends.compiler import GPUTarget

        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            raise RuntimeError("unset TRITON_INTERPRET: the interpreter compiles nothing")
        self.arch = arch
        self.target = GPUTarget("cuda", arch, 32)
        self.compiled: list[Compiled] = []
        self._undo: list = []

    def __enter__(self) -> "CompileOnly":
        import importlib

        from triton.runtime import driver
        from triton.runtime.jit import JITFunction

        target = self.target

        class _Driver:  # the calls JITFunction.run makes before it compiles
            def get_current_target(self):
                return target

            def get_current_device(self):
                return 0

            def get_current_stream(self, device=None):
                return 0

            def get_active_torch_device(self):
                return torch.device("cpu")

        self._patch(driver, "_active", _Driver())  # without a GPU there is no real driver
        for name in WRAPPER_MODULES:
            mod = importlib.import_module(name)
            self._patch(mod, "check_launchable", lambda kernel, device: None)
            for obj in vars(mod).values():
                if isinstance(obj, JITFunction):
                    # fresh binders (they hold the target), a compiler in place of the launch
                    self._patch(obj, "device_caches", defaultdict(obj.create_binder))
                    self._patch(obj, "_do_compile", self._compiler_for(obj))
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch(self, obj, attr: str, value) -> None:
        had = attr in vars(obj)
        old = vars(obj).get(attr)
        setattr(obj, attr, value)
        self._undo.append(lambda: setattr(obj, attr, old) if had else delattr(obj, attr))

    def _compiler_for(self, fn):
        import triton

        def do_compile(key, signature, device, constexprs, options, attrs, warmup):
            src = triton.compiler.ASTSource(fn, signature, constexprs, attrs)
            k = triton.compile(src, target=self.target, options=options.__dict__)
            self.compiled.append(describe(fn.__name__, k))
            return None  # nothing to launch: JITFunction.run returns without a launch

        return do_compile


def describe(name: str, k) -> Compiled:
    """Resources of compiled kernel ``k`` (via ``cuobjdump -res-usage``) and its instructions
    (counted in its TritonGPU IR)."""
    from triton import knobs

    tool = Path(knobs.nvidia.ptxas.path).with_name("cuobjdump")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cubin"
        path.write_bytes(k.asm["cubin"])
        usage = subprocess.run([str(tool), "-res-usage", str(path)], capture_output=True,
                               text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:\d+ SHARED:(\d+) LOCAL:(\d+)", usage)
    if m is None:
        raise RuntimeError(f"cuobjdump printed no resource usage for {name}:\n{usage}")
    ir = k.asm["ttgir"]
    return Compiled(
        kernel=name, num_warps=k.metadata.num_warps, regs=int(m[1]), local_bytes=int(m[3]),
        shared_bytes=int(m[2]) + k.metadata.shared,
        tma_loads=len(re.findall(r"async_tma_copy_global_to_local", ir)),
        cp_async_loads=len(re.findall(r"ttg\.async_copy_global_to_local", ir)),
        wgmma_dots=len(re.findall(r"ttng\.warp_group_dot ", ir)),
        mma_dots=len(re.findall(r"tt\.dot ", ir)),
        ttgir=ir,
    )


def launches(kernels, sweep: bool, arch: int):
    """(label, thunk) pairs: each thunk calls one wrapper the way the runtime or the benchmark
    does, on small CPU tensors (the shapes that matter to the compiler are the head layout,
    dtypes and the launch configuration, not the lengths)."""
    from bench.kernel_sweep import extend_candidates
    from bench.kernel_util import extend_inputs, new_kv, paged_context

    heads = {"d64 (9q/3kv)": (9, 3, 64), "d128 (32q/8kv)": (32, 8, 128)}
    out = []
    for hname, (hq, hkv, d) in heads.items():
        kc, vc, table, sl = paged_context([40, 70], hkv, d, torch.bfloat16, "cpu")
        q = torch.randn(2, hq, d).to(torch.bfloat16)
        out.append((f"decode {hname} split", lambda q=q, kc=kc, vc=vc, t=table, s=sl, d=d:
                    kernels.decode_attention(q, kc, vc, t, s, d**-0.5, num_splits=4)))
        out.append((f"decode {hname} direct", lambda q=q, kc=kc, vc=vc, t=table, s=sl, d=d:
                    kernels.decode_attention(q, kc, vc, t, s, d**-0.5, num_splits=1)))
        dflt = kernels.default_extend_config(d)
        configs = [dflt, dflt._replace(tma=True)]
        if sweep:
            configs += extend_candidates(kernels)
        if arch < 90:  # TMA is Hopper's; the wrapper refuses it on older GPUs
            configs = [c for c in configs if not c.tma]
        for prefix in (0, 40):
            args, _ = extend_inputs([prefix] * 2, [50, 50], hq, hkv, d, torch.bfloat16, "cpu")
            nk = new_kv(args)
            seen = set()
            for cfg in configs:
                for mode in ("paged", "new-kv"):
                    if (mode == "paged" and cfg.tma) or (cfg, mode) in seen:
                        continue
                    seen.add((cfg, mode))
                    extra = nk if mode == "new-kv" else {}
                    out.append((f"extend {hname} prefix {prefix:2d} {mode:6s} {cfg.label()}",
                                lambda a=args, c=cfg, e=extra:
                                kernels.extend_attention(*a, config=c, **e)))
    k = torch.randn(8, 8, 128).to(torch.bfloat16)
    cache = torch.zeros(4, 16, 8, 128, dtype=torch.bfloat16)
    out.append(("kv store d128 bf16", lambda: kernels.store_kv(
        k, k, cache, cache.clone(), torch.arange(8), check_indices=False)))
    buf = torch.zeros(2, 2, 8, 16, 8, 128, dtype=torch.bfloat16)
    out.append(("page copy d128 bf16", lambda: kernels.copy_pages(
        buf, torch.tensor([0, 1]), torch.tensor([4, 5]), check_indices=False)))
    return out


def report(arch: int = 90, sweep: bool = False, quiet: bool = False) -> list[tuple[str, Compiled]]:
    """Compile every launch of :func:`launches`; returns ``(label, Compiled)`` pairs (several
    per label when a wrapper launches several kernels). Raises on a compile failure."""
    import agentlang.kernels as kernels

    rows = []
    with CompileOnly(arch) as cc:
        for label, call in launches(kernels, sweep, arch):
            n = len(cc.compiled)
            call()
            for c in cc.compiled[n:]:
                rows.append((label, c))
                if not quiet:
                    print(f"  {label:58s} {c.kernel:18s} {c.regs:4d} {c.local_bytes:6d} "
                          f"{c.shared_bytes // 1024:7d} {c.programs_per_sm(arch):5d}   "
                          f"tma {c.tma_loads:2d} cp.async {c.cp_async_loads:2d} "
                          f"wgmma {c.wgmma_dots} mma {c.mma_dots}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, choices=sorted(SM_SHARED),
                    help="compute capability x10 (90: H100/H200, 80: A100)")
    ap.add_argument("--sweep", action="store_true", help="also every extend sweep candidate")
    opts = ap.parse_args()
    import triton

    print(f"compiling for sm_{opts.arch} with triton {triton.__version__} (no GPU, no launch)")
    print(f"  {'launch':58s} {'kernel':18s} {'regs':>4s} {'spill':>6s} {'smem KiB':>7s} "
          f"{'per SM':>5s}   instructions")
    try:
        rows = report(opts.arch, opts.sweep)
    except Exception as e:  # noqa: BLE001 - reported as the result of this tool
        print(f"COMPILE FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    spilled = sorted({label for label, c in rows if c.local_bytes})
    print(f"{len(rows)} kernels compiled; launches with spills: {spilled or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
