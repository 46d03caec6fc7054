"""Per-agent accounting: requests, tokens, cache hits and queue time by request label.

A request may carry an ``agent`` label (``SamplingParams.agent``; the DSL sets the program
name by default). Totals are kept per label for the first ``max_labels`` distinct labels;
later labels are counted under ``"other"`` and unlabelled requests under ``"unlabeled"``, so
the number of series exported to ``/metrics`` is bounded by ``max_labels + 2``.

Labels: 1 to ``LABEL_MAX_LEN`` characters from letters, digits and ``_ . : / -`` (they become
Prometheus label values and dashboard keys).
"""

from __future__ import annotations

import re
import threading
from dataclasses import asdict, dataclass
from typing import Any

LABEL_MAX_LEN = 64
OTHER = "other"
UNLABELED = "unlabeled"
_LABEL = re.compile(r"[A-Za-z0-9_.:/-]+")


def check_label(value: Any, field: str = "agent") -> str | None:
    """``value`` if it is None or a valid label, else ValueError naming ``field``."""
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= LABEL_MAX_LEN \
            or not _LABEL.fullmatch(value):
        raise ValueError(f"{field}: must be a string of 1 to {LABEL_MAX_LEN} letters, digits "
                         f"or _ . : / -, got {value!r}")
    return value


@dataclass
class LabelTotals:
    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_tokens: int = 0
    queue_s: float = 0.0        # sum over requests of (first admission - arrival)


class AgentStats:
    """Totals by label, updated by the stepping thread and read by any thread."""

    def __init__(self, max_labels: int = 32):
        if not isinstance(max_labels, int) or max_labels < 0:
            raise ValueError(f"max_labels: must be an integer >= 0, got {max_labels!r}")
        self.max_labels = max_labels
        self._totals: dict[str, LabelTotals] = {}
        self._named = 0             # distinct user labels with their own series
        self._lock = threading.Lock()

    def bucket(self, label: str | None) -> str:
        """The series a request with ``label`` is counted under (does not add it)."""
        if label is None:
            return UNLABELED
        if label in self._totals or self._named < self.max_labels:
            return label
        return OTHER

    def record(self, label: str | None, prompt_tokens: int, generated_tokens: int,
               cached_tokens: int, queue_s: float) -> None:
        """Count one finished request."""
        with self._lock:
            key = self.bucket(label)
            if key not in self._totals:
                self._totals[key] = LabelTotals()
                if key == label:
                    self._named += 1
            t = self._totals[key]
            t.requests += 1
            t.prompt_tokens += prompt_tokens
            t.generated_tokens += generated_tokens
            t.cached_tokens += cached_tokens
            t.queue_s += queue_s

    def snapshot(self) -> dict[str, dict[str, float]]:
        """``{label: {requests, prompt_tokens, generated_tokens, cached_tokens, queue_s}}``."""
        with self._lock:
            return {k: asdict(v) for k, v in self._totals.items()}
