"""The request checks that depend on the served model and pool, written once.

:class:`RequestLimits` is a plain value (three integers): the engine builds its requests
through it, and the server checks a request with the same object before answering (so a server
in front of an engine in another process, holding only these numbers, still answers 4xx before
its first SSE byte). Every failure is an
:class:`~agentlang.runtime.core.errors.EngineValueError` (a ``ValueError``) whose typed error
names the request field; the server maps its code to the HTTP status in one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentlang.runtime.core.errors import EngineError, EngineValueError, ErrorCode


def _refuse(code: ErrorCode, field: str, message: str) -> EngineValueError:
    return EngineValueError(EngineError(code, field, message))


def _is_token_list(ids: Any) -> bool:
    return isinstance(ids, list) and bool(ids) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in ids)


@dataclass(frozen=True)
class RequestLimits:
    """``vocab_size`` token ids, a context of ``max_context`` tokens, a KV pool of
    ``capacity_tokens`` tokens."""

    vocab_size: int
    max_context: int
    capacity_tokens: int

    @property
    def token_limit(self) -> int:
        """Most tokens (prompt + output) one sequence may hold: the context, or the KV pool
        if smaller."""
        return min(self.max_context, self.capacity_tokens)

    def describe(self) -> str:
        return (f"{self.token_limit} tokens (model context {self.max_context}, KV pool "
                f"{self.capacity_tokens}; a larger kv_budget_mb / --kv-budget-mb raises the pool)")

    def check_ids(self, ids: Any, field: str) -> list[int]:
        """``ids`` as a list of token ids of this vocabulary; ``ValueError`` naming ``field``."""
        if not _is_token_list(ids):
            raise ValueError(f"{field}: must be a non-empty list of token ids")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{field}: token ids must be in [0, {self.vocab_size}), "
                             f"got {bad[:3]}")
        return list(ids)

    def check_prompt(self, prompt_len: int, field: str = "prompt") -> None:
        """A prompt of ``prompt_len`` tokens leaves room for one token in the context and in
        the pool."""
        if prompt_len >= self.max_context:
            raise _refuse(ErrorCode.CONTEXT_EXCEEDED, field,
                          f"{prompt_len} tokens, the model's context is {self.max_context} "
                          f"tokens")
        if prompt_len + 1 > self.capacity_tokens:
            raise _refuse(ErrorCode.KV_POOL_EXCEEDED, field,
                          f"{prompt_len} tokens do not fit the KV pool ({self.capacity_tokens} "
                          f"tokens; raise kv_budget_mb)")

    def output_budget(self, prompt_len: int, requested: int | None, field: str,
                      prompt_field: str) -> int:
        """The output tokens a request may have: ``requested``, or with ``None`` all that
        fit. ``context_length_exceeded`` (typed ``CONTEXT_EXCEEDED``) naming ``prompt_field``
        when the prompt leaves no room, ``field`` when prompt + ``requested`` exceed the
        limit. A ``requested`` that is not a positive integer is returned as is (the
        sampling-parameter check names it)."""
        limit = self.token_limit
        if prompt_len >= limit:
            raise _refuse(ErrorCode.CONTEXT_EXCEEDED, prompt_field,
                          f"the prompt is {prompt_len} tokens, the limit is {self.describe()}")
        if requested is None:
            return limit - prompt_len
        if isinstance(requested, int) and not isinstance(requested, bool) and requested >= 1 \
                and prompt_len + requested > limit:
            raise _refuse(ErrorCode.CONTEXT_EXCEEDED, field,
                          f"prompt ({prompt_len} tokens) + {field} ({requested}) exceeds the "
                          f"limit of {self.describe()}")
        return requested
