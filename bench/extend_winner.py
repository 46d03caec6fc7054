"""The extend launch sweep's verdict, read from ``kernels.json`` (``bench/kernels.py`` sections
``sweep-extend`` and ``extend``): the winning launch per head layout, whether it differs from
the wrapper's default (``kernels.default_extend_config``, the one to change), and the winner's
CUDA-graph time against SDPA's flash time on causal prefill (no cached prefix; issue #18's
target: within 1.3x at head_dim 128).

    python bench/extend_winner.py DIR     # DIR holds kernels.json; writes DIR/extend_winner.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TARGET = 1.3


def verdict(kernels_json: dict) -> dict:
    """``{head name: {"winner", "is_default", "prefill_ratio_graph", "meets_target"}}``;
    ``prefill_ratio_graph`` is the worst winner/SDPA ratio over the prefix-0 cells."""
    out = {}
    for name, cfg in kernels_json.get("chosen", {}).get("extend", {}).items():
        rows = [r for r in kernels_json.get("extend", []) if r["heads"] == name and
                r["prefix"] == 0]
        worst = max((r["ratio_graph"] for r in rows), default=None)
        defaults = [r["config"] for r in kernels_json.get("sweep", [])
                    if r.get("kind") == "extend" and r["heads"] == name]
        out[name] = {"winner": cfg, "is_default": bool(defaults) and defaults[0] == cfg,
                     "prefill_ratio_graph": worst,
                     "meets_target": worst is not None and worst <= TARGET}
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    folder = Path(argv[0])
    result = verdict(json.loads((folder / "kernels.json").read_text()))
    (folder / "extend_winner.json").write_text(json.dumps(result, indent=1))
    for name, v in result.items():
        ratio = v["prefill_ratio_graph"]
        which = "the default" if v["is_default"] else "NOT the default: make it the default"
        shown = "n/a" if ratio is None else f"{ratio:.2f}x"
        print(f"extend winner {name}: {v['winner']} ({which}); causal prefill {shown} SDPA's "
              f"time, target <= {TARGET}x: {'met' if v['meets_target'] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
