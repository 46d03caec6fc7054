"""Typed errors of the engine: a code plus the request field it is about.

The engine reports a failed request as ``RequestOutput.error``: an :class:`EngineError`, never
a bare message. The server maps ``code`` to an HTTP status in one table
(:data:`agentlang.runtime.server.errors.ENGINE_ERROR_STATUS`) and names ``field`` in its error body, so
no caller has to match message text. ``str(err)`` is the human-readable message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ErrorCode(enum.Enum):
    """Why a request failed."""

    KV_POOL_EXCEEDED = "kv_pool_exceeded"        # the request cannot fit the KV pool at all
    CONTEXT_EXCEEDED = "context_exceeded"        # prompt (+ output) beyond the model's context
    INVALID_CONSTRAINT = "invalid_constraint"    # the output constraint does not compile
    ENGINE_FAILURE = "engine_failure"            # the engine loop failed (a bug or a crash)


@dataclass(frozen=True)
class EngineError:
    """One failed request: ``code``, the request ``field`` it is about (engine names:
    ``"prompt"``, ``"max_tokens"``, ``"json_schema"``, …; ``None`` when it is about no single
    field) and a message for people."""

    code: ErrorCode
    field: str | None
    message: str

    def __str__(self) -> str:
        return self.message if self.field is None else f"{self.field}: {self.message}"


UNFIT_IN_KV_POOL = EngineError(ErrorCode.KV_POOL_EXCEEDED, "prompt",
                               "the request does not fit in the KV pool, even with the prefix "
                               "cache evicted")


def constraint_error(field: str | None, exc: BaseException) -> EngineError:
    """The error of a constraint that failed to compile (``exc``'s message may already start
    with ``field``)."""
    message = str(exc)
    if field is not None and message.startswith(f"{field}: "):
        message = message[len(field) + 2:]
    return EngineError(ErrorCode.INVALID_CONSTRAINT, field, message)


class EngineValueError(ValueError):
    """A request the engine rejects before queueing it, with its typed :attr:`error`."""

    def __init__(self, error: EngineError):
        super().__init__(str(error))
        self.error = error
