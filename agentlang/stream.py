"""The contract between the interpreter and the stream it runs on.

``StreamExecutor`` (executor.py) implements it; the interpreter (interpreter.py) and the agent
loop (agent.py) use nothing else of a stream, and run on the stream's worker thread.
"""

from __future__ import annotations

from typing import Any, Protocol

from agentlang.sampling import SamplingOptions


class Stream(Protocol):
    """What the interpreter (and the agent loop) needs of the stream it runs on."""

    ctx: Any                      # the run's RunContext: backend, template, rng, release()
    text_: str                    # the stream's text so far
    messages_: list[dict]         # closed chat messages so far
    scopes: dict[str, int]        # open var_scope name → text offset where it began

    def fill(self, text: str) -> None: ...
    def begin_role(self, role: str) -> None: ...
    def end_role(self, role: str) -> None: ...
    def store_var(self, name: str | None, value: Any, meta: Any = None) -> None: ...
    def resolve(self, options: SamplingOptions) -> SamplingOptions: ...
    def generate_text(self, opts: SamplingOptions, name: str | None = None
                      ) -> tuple[str, Any]: ...
