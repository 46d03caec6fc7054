"""The engine's step without a model: real scheduler, radix cache, page allocator, request
tracker, request builder and output processor around a fake model runner whose logits are
known in advance, so scheduling and output processing are tested in milliseconds."""

from __future__ import annotations

import torch

from agentlang.runtime.core.agent_stats import AgentStats
from agentlang.runtime.engine.step_core import StepCore
from agentlang.runtime.engine.output_processor import OutputProcessor
from agentlang.runtime.cache.page_allocator import PageAllocator
from agentlang.runtime.cache.radix_cache import RadixCache
from agentlang.runtime.request.request import RequestGroup
from agentlang.runtime.engine.request_builder import LazyGrammarCache, RequestBuilder
from agentlang.runtime.request.limits import RequestLimits
from agentlang.runtime.engine.request_tracker import RequestTracker
from agentlang.runtime.sampling.params import SamplingParams
from agentlang.runtime.scheduler.scheduled import ScheduledItem
from agentlang.runtime.scheduler.config import SchedulerConfig
from agentlang.runtime.scheduler.scheduler import Scheduler
from agentlang.runtime.speculative import DraftPolicy

VOCAB = 64
EOS = VOCAB - 1


class FakeTokenizer:
    """Token t is the letter ``chr(ord('a') + t % 26)``; token ``EOS`` is special."""

    eos_token_id = EOS

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + t % 26) for t in ids if not (skip_special_tokens and t == EOS))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) - ord("a") for c in text]


def next_token(t: int) -> int:
    """The fake model's greedy choice after token ``t`` (never EOS unless ``t == EOS - 1``)."""
    return (t + 1) % VOCAB


def expected_tokens(prompt: list[int], n: int) -> list[int]:
    """The fake model's greedy continuation of ``prompt`` (``n`` tokens, EOS ignored)."""
    out, t = [], prompt[-1]
    for _ in range(n):
        t = next_token(t)
        out.append(t)
    return out


def greedy(**params) -> SamplingParams:
    return SamplingParams(temperature=0.0, **params)


class FakeRunner:
    """Stands in for ``ModelRunner``: each logits row puts 10.0 on ``next_token`` of the token
    at its position and -10.0 elsewhere. Records every step's items."""

    def __init__(self) -> None:
        self.steps: list[list[ScheduledItem]] = []
        self.tokens_run = 0
        self.forward_passes = 0

    def run(self, items: list[ScheduledItem], between_layers=None) -> torch.Tensor:
        """Logits of ``items``; ``between_layers`` (if given) runs once, as after layer 0."""
        self.steps.append(list(items))
        self.tokens_run += sum(len(it.tokens) for it in items)
        self.forward_passes += 1
        if between_layers is not None:
            between_layers()
        targets = []
        for it in items:
            ids = it.req.all_ids + it.req.draft
            targets += [next_token(ids[it.start + r]) for r in it.logits_rows]
        logits = torch.full((len(targets), VOCAB), -10.0)   # [rows, V]
        logits[torch.arange(len(targets)), torch.tensor(targets, dtype=torch.long)] = 10.0
        return logits


def _no_grammar():
    raise AssertionError("this harness compiles no grammars")


class StepHarness:
    def __init__(self, page_size: int = 4, num_pages: int = 256, max_batch_tokens: int = 256,
                 max_running: int = 16, max_wait_steps: int = 64, min_shared_prefix: int = 32,
                 max_context: int = 4096, low_priority_values_first: bool = False,
                 max_agent_labels: int = 32, max_lower_priority_tokens: int = 8,
                 urgent_slots: int = 4, speculative: bool = False,
                 policy: DraftPolicy | None = None, schedule_policy: str = "lpm",
                 retain_max_pages: int = 0, busy_requests: int | None = None):
        self.allocator = PageAllocator(num_pages)
        self.cache = RadixCache(self.allocator, page_size)
        self.scheduler = Scheduler(
            SchedulerConfig(page_size, max_batch_tokens, max_running, max_wait_steps,
                            min_shared_prefix, low_priority_values_first,
                            max_lower_priority_tokens, urgent_slots,
                            retain_max_pages=retain_max_pages, schedule_policy=schedule_policy,
                            busy_requests=busy_requests),
            self.allocator, self.cache, lambda src, dst: None)
        self.agent_stats = AgentStats(max_agent_labels)
        self.tracker = RequestTracker(self.agent_stats)
        self.tokenizer = FakeTokenizer()
        self.builder = RequestBuilder(
            self.tokenizer, RequestLimits(VOCAB, max_context, num_pages * page_size), ("fake",),
            LazyGrammarCache(_no_grammar), seed=0)
        self.processor = OutputProcessor(self.tracker, self.scheduler, self.builder,
                                         self.tokenizer, {EOS}, max_context, policy, speculative)
        self.runner = FakeRunner()
        self.arrivals: list[RequestGroup] = []     # submitted while a step is in flight
        self.core = StepCore(self.scheduler, self.processor, self.tracker, self.allocator,
                             self.cache, self.runner, self._take_arrivals)
        self.breaks = self.core.breaks
        self.num_steps = 0

    def submit(self, ids: list[int], **params) -> RequestGroup:
        """Add a greedy group (``params`` override ``SamplingParams`` fields)."""
        group = self.builder.group(list(ids), greedy(**params))
        self.processor.add(group)
        return group

    def submit_mid_step(self, ids: list[int], **params) -> RequestGroup:
        """A group that arrives while the next step's forward runs (taken between its layers,
        or queued after the step if it runs none)."""
        group = self.builder.group(list(ids), greedy(**params))
        self.arrivals.append(group)
        return group

    def _take_arrivals(self) -> bool:
        took, self.arrivals = self.arrivals, []
        for g in took:
            self.processor.add(g)
        return bool(took)

    def step(self) -> bool:
        """The engine's step (:class:`StepCore`), then the arrivals no forward took (the engine's
        inbox drain at the next step's start)."""
        self.num_steps += 1
        busy = self.core.step()
        self._take_arrivals()
        return busy or self.scheduler.has_work

    def run(self, max_steps: int = 1000) -> None:
        for _ in range(max_steps):
            if not self.step():
                return
        raise AssertionError(f"still busy after {max_steps} steps")

    def assert_no_leak(self) -> None:
        """Nothing running; after a flush every page is free and the tree is consistent."""
        assert not self.scheduler.has_work
        self.cache.check_integrity()
        self.cache.flush()
        assert self.allocator.num_free == self.allocator.num_pages
