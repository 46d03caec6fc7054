"""The owner of the engine's live requests: request groups by id, groups waiting for their
grammar to compile, and the request counters (overall, and per agent label when given an
:class:`~agentlang.runtime.core.agent_stats.AgentStats`).

Bookkeeping only — it never touches the scheduler or the cache. It is used from the thread
that steps the engine (submissions and aborts reach it through the engine's inbox).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

from agentlang.runtime.core.agent_stats import AgentStats
from agentlang.runtime.request.request import RequestGroup


@dataclass
class RequestCounters:
    """Totals since the engine started."""

    prompt_tokens: int = 0        # prompt tokens of every submitted group
    generated_tokens: int = 0     # sampled tokens, all completions
    requests_finished: int = 0    # groups whose every completion finished
    spec_draft_tokens: int = 0    # speculation: context-lookup draft tokens verified
    spec_accepted_tokens: int = 0  # of those, kept
    spec_verify_steps: int = 0    # completion-steps that verified such a draft


class RequestTracker:
    def __init__(self, agent_stats: AgentStats | None = None) -> None:
        self.counters = RequestCounters()
        self.agent_stats = agent_stats
        self._groups: dict[str, RequestGroup] = {}
        self._pending_grammar: list[RequestGroup] = []

    # ---- arrival ------------------------------------------------------------------------
    def register(self, group: RequestGroup) -> bool:
        """Track a submitted group. Returns whether it can start now; False means its grammar
        is still compiling and it waits until :meth:`take_ready` hands it out."""
        self._groups[group.rid] = group
        self.counters.prompt_tokens += len(group.prompt_ids)
        compiling = isinstance(group.grammar, Future) and not group.grammar.done()
        if compiling:
            self._pending_grammar.append(group)
        return not compiling

    def take_ready(self) -> list[RequestGroup]:
        """The waiting groups whose grammar finished compiling (successfully or not), in
        arrival order; they stop waiting."""
        ready = [g for g in self._pending_grammar if g.grammar.done()]
        for g in ready:
            self._pending_grammar.remove(g)
        return ready

    def stop_waiting(self, group: RequestGroup) -> None:
        """Forget that ``group`` waits for its grammar (it is being aborted)."""
        if group in self._pending_grammar:
            self._pending_grammar.remove(group)

    # ---- lookups ------------------------------------------------------------------------
    def get(self, rid: str) -> RequestGroup | None:
        return self._groups.get(rid)

    def rids(self) -> list[str]:
        """The ids of all live groups (a copy: safe to iterate while finishing them)."""
        return list(self._groups)

    @property
    def num_waiting_grammar(self) -> int:
        return len(self._pending_grammar)

    # ---- progress -----------------------------------------------------------------------
    def count_generated(self, n: int = 1) -> None:
        self.counters.generated_tokens += n

    def count_speculation(self, drafted: int, accepted: int) -> None:
        c = self.counters
        c.spec_draft_tokens += drafted
        c.spec_accepted_tokens += accepted
        c.spec_verify_steps += 1

    def retire(self, group: RequestGroup) -> None:
        """A group finished: stop tracking it and count it."""
        self.counters.requests_finished += 1
        self._groups.pop(group.rid, None)
        self.stop_waiting(group)
        if self.agent_stats is not None:
            self.agent_stats.record(group.params.agent, len(group.prompt_ids),
                                    sum(len(c.output_ids) for c in group.children),
                                    group.cached_tokens, group.queue_s)
