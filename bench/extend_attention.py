"""Float32 extend attention on CPU: torch's matmul (MKL) vs the oneDNN path, side by side.

For causal extends of ``n`` new tokens over ``start`` cached ones (SmolLM2-135M's heads: 9 query
/ 3 KV heads, head_dim 64), times ``cascade.causal_attend`` with the oneDNN path off and on
and checks both against a float64 reference. ``python bench/extend_attention.py``
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agentlang.runtime.attention import cascade, onednn  # noqa: E402


def bench(f, n: int = 10) -> float:
    f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e3


def reference(q, k, v, start: int, scale: float) -> torch.Tensor:
    n, Hq, D = q.shape
    G = Hq // k.shape[1]
    out = torch.empty(n, Hq, D, dtype=torch.float64)
    for h in range(Hq):
        s = (q[:, h].double() @ k[:, h // G].double().T) * scale
        s += torch.full(s.shape, float("-inf"), dtype=torch.float64).triu_(start + 1)
        out[:, h] = s.softmax(-1) @ v[:, h // G].double()
    return out


def main() -> None:
    torch.manual_seed(0)
    keep = onednn.MIN_ROWS
    for start, n in ((1900, 150), (0, 512), (0, 2048), (4000, 128)):
        q, k, v = torch.randn(n, 9, 64), torch.randn(start + n, 3, 64), torch.randn(start + n, 3, 64)
        run = lambda: cascade.causal_attend(q, k, v, start, 0.125)  # noqa: E731
        onednn.MIN_ROWS = 10 ** 9
        t_mkl, o_mkl = bench(run), run()
        onednn.MIN_ROWS = keep
        t_dnn, o_dnn = bench(run), run()
        ref = reference(q, k, v, start, 0.125)
        print(f"cached {start:5d} new {n:5d}: torch/MKL {t_mkl:6.2f} ms  oneDNN {t_dnn:6.2f} ms  "
              f"x{t_mkl / t_dnn:.2f}  max err vs float64 {(o_mkl.double() - ref).abs().max():.1e} / "
              f"{(o_dnn.double() - ref).abs().max():.1e}", flush=True)


if __name__ == "__main__":
    main()
