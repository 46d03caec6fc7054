"""Per-request state inside the engine.

A :class:`RequestGroup` is what a caller submitted (one prompt, ``n`` completions); each
completion is a :class:`Request` with its own tokens, page table, generator and grammar matcher.
The prompt is computed once by the first request; at its first sample it forks the page table
(copy-on-write) into the other ``n - 1`` siblings.

Token bookkeeping of a request: ``all_ids = prompt_ids + output_ids``; the first
``num_computed`` of them have K/V in the pool. Each step runs ``all_ids[num_computed:]``
(or a chunk of it); a decode is the case of exactly one uncomputed token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch

from agentlang.runtime.request.detokenizer import OutputText
from agentlang.runtime.core.errors import EngineError
from agentlang.runtime.request.outputs import CompletionOutput, RequestOutput, StreamDelta
from agentlang.runtime.sampling.sampler import TokenLogprob
from agentlang.runtime.sampling.params import SamplingParams
from agentlang.runtime.speculative import ContextLookup, DraftStats

if TYPE_CHECKING:
    from agentlang.runtime.grammar.base import CompiledGrammar, GrammarMatcher
    from agentlang.runtime.grammar.budget import BudgetGuard
    from agentlang.runtime.cache.page_table import PageTable
    from agentlang.runtime.cache.radix_node import TreeNode


@dataclass(eq=False)
class RequestGroup:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    namespace: tuple
    sink: Callable[[StreamDelta], None] | None = None
    prefill_only: bool = False            # score / cache_prefix: no sampling
    logprob_start: int | None = None      # first prompt position whose logprob is wanted
    children: list["Request"] = field(default_factory=list)
    arrival: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    admit_time: float | None = None       # first admission to the running batch
    finish_time: float | None = None
    cached_tokens: int = 0
    prompt_logprobs: list[float | None] | None = None
    error: EngineError | None = None
    on_finish: Callable[["RequestGroup"], None] | None = None
    grammar: Future[CompiledGrammar] | None = None   # the constraint's compilation, if any
    session: tuple | None = None          # (namespace, session id): its KV is held when it ends
    final_sent: bool = False

    @property
    def finished(self) -> bool:
        return bool(self.children) and all(c.finish_reason is not None for c in self.children)

    @property
    def queue_s(self) -> float:
        """Arrival → first admission (→ now or the finish, if it was never admitted)."""
        end = self.admit_time or self.finish_time or time.perf_counter()
        return end - self.arrival

    def output(self) -> RequestOutput:
        outs = [c.completion() for c in sorted(self.children, key=lambda c: c.index)]
        end = self.finish_time or time.perf_counter()
        meta = {
            "prompt_tokens": len(self.prompt_ids),
            "cached_tokens": self.cached_tokens,
            "completion_tokens": sum(len(o.token_ids) for o in outs),
            "ttft_s": None if self.first_token_time is None else self.first_token_time - self.arrival,
            "latency_s": end - self.arrival,
            "forward_passes_saved": sum(c.passes_saved for c in self.children),
            "spec_verify_ct": sum(c.spec.verifies for c in self.children),
            "spec_draft_tokens": sum(c.spec.drafted for c in self.children),
            "spec_accepted_tokens": sum(c.spec.accepted for c in self.children),
            "preemptions": sum(c.preemptions for c in self.children),
            "queue_s": self.queue_s,
        }
        return RequestOutput(self.rid, list(self.prompt_ids), outs, meta,
                             self.prompt_logprobs, self.error)


class RequestRow(NamedTuple):
    """A request as a live view shows it (``Request.row``)."""

    rid: str
    index: int                    # completion index within its group (n > 1)
    state: str                    # "running" | "waiting"
    prompt_tokens: int
    output_tokens: int
    max_tokens: int | None
    computed: int                 # tokens with K/V in the pool
    cached_tokens: int            # prompt tokens found in the prefix cache at admission
    age_s: float                  # since arrival
    ttft_s: float | None          # arrival to first output token; None before it
    preemptions: int

    def as_dict(self) -> dict:
        return dict(zip(self._fields, self))


@dataclass(eq=False)
class Request:
    group: RequestGroup
    index: int
    out: OutputText
    generator: torch.Generator | None
    matcher: GrammarMatcher | None = None
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    page_table: PageTable | None = None    # while admitted
    lock_node: TreeNode | None = None      # radix node locked while admitted
    admit_seq: int = -1                    # admission order (preemption picks the newest)
    wait_steps: int = 0                    # steps spent waiting, whole life (aging: priority.py)
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    logprobs: list[TokenLogprob] | None = None
    passes_saved: int = 0
    budget: BudgetGuard | None = None      # keeps a constrained output completable in budget
    draft: list[int] = field(default_factory=list)   # tokens to verify next step
    draft_kind: str = ""                   # where ``draft`` came from: "grammar" | "lookup"
    lookup: ContextLookup | None = None    # n-gram index of all_ids (speculation), built lazily
    shadow: int | None = None              # a declined draft's first token (policy's evidence)
    spec: DraftStats = field(default_factory=DraftStats)   # speculation's counters
    preemptions: int = 0
    sent_tokens: int = 0                   # output tokens already streamed
    sent_logprobs: int = 0

    @property
    def params(self) -> SamplingParams:
        return self.group.params

    @property
    def priority(self) -> int:
        return self.group.params.priority

    @property
    def prompt_ids(self) -> list[int]:
        return self.group.prompt_ids

    @property
    def all_ids(self) -> list[int]:
        return self.group.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.group.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        """Tokens the next step(s) must run: the uncomputed tail plus any draft."""
        return self.num_tokens + len(self.draft) - self.num_computed

    def row(self, state: str, now: float) -> RequestRow:
        """This request as a :class:`RequestRow`; ``now`` is a ``time.perf_counter()``."""
        g = self.group
        return RequestRow(g.rid, self.index, state, len(g.prompt_ids), len(self.output_ids),
                          self.params.max_tokens, self.num_computed, g.cached_tokens,
                          now - g.arrival,
                          None if g.first_token_time is None else g.first_token_time - g.arrival,
                          self.preemptions)

    def completion(self) -> CompletionOutput:
        return CompletionOutput(self.index, self.out.text, list(self.output_ids),
                                self.finish_reason, self.matched_stop,
                                None if self.logprobs is None else list(self.logprobs),
                                0 if self.budget is None else self.budget.forced)

    def take_delta(self) -> StreamDelta:
        final = self.finish_reason is not None
        new_ids = self.output_ids[self.sent_tokens:]
        self.sent_tokens = len(self.output_ids)
        lps = None
        if self.logprobs is not None:
            lps = self.logprobs[self.sent_logprobs:]
            self.sent_logprobs = len(self.logprobs)
        return StreamDelta(self.group.rid, self.index, self.out.take_delta(final), new_ids,
                           final, None, lps)
