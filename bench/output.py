"""Where a benchmark writes its JSON: never into the repository from a smoke run."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def results_path(name: str, out: str | Path | None, quick: bool) -> Path:
    """``out`` when given; else a full run writes the tracked ``bench/results/<name>.json``
    and a ``--quick`` (smoke) run a file in a fresh temporary directory."""
    if out is not None:
        return Path(out)
    if quick:
        return Path(tempfile.mkdtemp(prefix=f"agentlang-bench-{name}-")) / f"{name}.json"
    return RESULTS / f"{name}.json"


def write_results(name: str, results: dict, out: str | Path | None, quick: bool) -> Path:
    """Write ``results`` as indented JSON to :func:`results_path`; returns the path."""
    path = results_path(name, out, quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    return path
