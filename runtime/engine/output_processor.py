"""Processing one step's logits: commit KV, prompt logprobs, sampling, n>1 forks, stop
conditions, jump-forward, finishing and streaming deltas. Runs on the thread that steps.

Built from narrow parts: the request tracker (groups, pending grammars, counters), the
scheduler (queues, page release, prefix-cache insertion), the request builder (new
completions) and the constrained-sampling step (:mod:`agentlang.runtime.engine.constrained_step`: logits to
tokens, grammar, jump-forward and budget included); plus the stop token ids and the context
length.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from agentlang.runtime.core.errors import EngineError, constraint_error
from agentlang.runtime.request.request import Request, RequestGroup
from agentlang.runtime.engine.request_builder import RequestBuilder
from agentlang.runtime.engine.request_tracker import RequestTracker
from agentlang.runtime.engine.constrained_step import ConstrainedStep, Sampled, StepJob
from agentlang.runtime.scheduler.scheduled import ScheduledItem
from agentlang.runtime.scheduler.scheduler import Scheduler
from agentlang.runtime.speculative import DraftPolicy


class OutputProcessor:
    def __init__(self, tracker: RequestTracker, scheduler: Scheduler, builder: RequestBuilder,
                 tokenizer: Any, eos_ids: set[int], max_context: int,
                 policy: DraftPolicy | None = None, speculative: bool = False,
                 shared_cap: int = 0):
        self.tracker = tracker
        self.scheduler = scheduler
        self.builder = builder
        self.sampler = ConstrainedStep(tokenizer, eos_ids, max_context, policy, speculative,
                                       shared_cap)
        self.eos_ids = eos_ids
        self.max_context = max_context
        self.on_group_finish: Callable[[RequestGroup], None] | None = None   # sessions' hook

    # ---- intake -----------------------------------------------------------------------
    @property
    def spec_row_cost(self) -> float:
        """The row cost the draft policy uses now (given, measured, or the default)."""
        return self.sampler.policy.row_cost

    def add(self, group: RequestGroup) -> None:
        """A submitted group: queued now, or once its grammar has compiled."""
        if self.tracker.register(group):
            self._start(group)

    def admit_ready_grammars(self) -> None:
        for g in self.tracker.take_ready():
            self._start(g)

    def _start(self, group: RequestGroup) -> None:
        try:
            req = self.builder.request(group, 0)
        except Exception as exc:  # grammar compilation failed
            req = self.builder.placeholder(group)
            group.children.append(req)
            self.finish(req, "abort",
                        error=constraint_error(group.params.constraint_field(), exc))
            return
        group.children.append(req)
        self.scheduler.add(req)

    # ---- the step's outputs ---------------------------------------------------------------
    def process(self, items: Sequence[ScheduledItem], logits: torch.Tensor) -> None:
        touched: list[Request] = []
        jobs: list[StepJob] = []
        starts: list[int] = []               # per job: position of the request's last token
        row = 0
        for it in items:
            req = it.req
            req.page_table.commit(len(it.tokens))
            req.num_computed += len(it.tokens)
            rows = range(row, row + len(it.logits_rows))
            row += len(it.logits_rows)
            if req.group.logprob_start is not None:
                self._prompt_logprobs(it, logits[rows.start:rows.stop])
            if len(it.tokens) > 1 and it.start < len(req.prompt_ids):
                self.scheduler.cache_computed(req)
            if not it.completes:
                continue
            touched.append(req)
            if req.group.prefill_only:
                self.finish(req, "length")       # no output budget: nothing is sampled
                continue
            for r in self._fork_if_first_sample(req):   # a draft's rows end the item's rows
                jobs.append(StepJob(r, rows.stop - 1 - len(req.draft)))
                starts.append(it.start)
                touched.append(r)
        for job, start, sampled in zip(jobs, starts, self.sampler.run(jobs, logits)):
            self._take(job.req, sampled, start)
        self._emit(touched)

    def _prompt_logprobs(self, it: ScheduledItem, logits: torch.Tensor) -> None:
        g = it.req.group
        if g.prompt_logprobs is None:
            g.prompt_logprobs = [None] * len(g.prompt_ids)
        lp = torch.log_softmax(logits, dim=-1)
        for i, r in enumerate(it.logits_rows):
            pos = it.start + r + 1               # row p predicts token p + 1
            if pos < len(g.prompt_ids) and pos >= g.logprob_start:
                g.prompt_logprobs[pos] = float(lp[i, g.prompt_ids[pos]])

    def _fork_if_first_sample(self, req: Request) -> list[Request]:
        g = req.group
        if g.params.n == 1 or req.output_ids or len(g.children) > 1:
            return [req]
        tables = req.page_table.fork(g.params.n - 1)
        siblings = []
        for i, table in enumerate(tables, start=1):
            sib = self.builder.request(g, i)
            g.children.append(sib)
            self.scheduler.adopt_fork(req, sib, table)
            siblings.append(sib)
        return [req] + siblings

    def _take(self, req: Request, sampled: Sampled, start: int) -> None:
        """Append the step's tokens of ``req`` (its matcher holds them already), or fail it with
        the step's error. After a draft only the last token and the matched draft prefix keep
        their KV (from ``start``, the position of the token before the draft); appending stops
        at a finish."""
        drafted, kind, req.draft, req.draft_kind = len(req.draft), req.draft_kind, [], ""
        if sampled.error is not None:
            self.finish(req, "abort", error=sampled.error)
            return
        if drafted:
            keep = start + len(sampled.tokens)
            if req.num_computed > keep:
                req.page_table.truncate(keep)
                req.num_computed = keep
            req.passes_saved += len(sampled.tokens) - 1
            if kind == "lookup":
                self.tracker.count_speculation(drafted, sampled.kept)
        last = len(sampled.tokens) - 1
        for i, (tok, lp) in enumerate(zip(sampled.tokens, sampled.logprobs)):
            if self._append(req, tok, lp, last=i == last):
                return
        req.draft, req.draft_kind = sampled.next_draft, sampled.draft_kind

    def _append(self, req: Request, tok: int, lp, last: bool = True) -> bool:
        """Add one token; returns whether the request finished. Unless ``last``, later tokens
        of the step follow it, so the matcher's state says nothing about this position."""
        g = req.group
        if g.first_token_time is None:
            g.first_token_time = time.perf_counter()
        req.output_ids.append(tok)
        if req.logprobs is not None:
            req.logprobs.append(lp)
        self.tracker.count_generated()
        stop = req.out.append(tok)
        return self._check_finish(req, tok, stop, grammar_state=last)

    def _check_finish(self, req: Request, tok: int | None, stop: str | None,
                      grammar_state: bool = True) -> bool:
        p = req.params
        if stop is not None:
            self.finish(req, "stop", stop)
        elif tok is not None and tok in self.eos_ids and not p.ignore_eos:
            self.finish(req, "stop", tok)
        elif tok is not None and tok in p.stop_token_ids:
            self.finish(req, "stop", tok)
        elif grammar_state and req.matcher is not None and req.matcher.is_terminated():
            self.finish(req, "stop")
        elif len(req.output_ids) >= p.max_tokens or req.num_tokens >= self.max_context:
            self.finish(req, "length")
        else:
            return False
        return True

    # ---- finishing ----------------------------------------------------------------------
    def finish(self, req: Request, reason: str, matched=None,
               error: EngineError | None = None) -> None:
        if req.finish_reason is not None:
            return
        req.finish_reason, req.matched_stop = reason, matched
        self.scheduler.remove(req)
        if reason != "abort":
            self.sampler.finished(req)
        g = req.group
        if error:
            g.error = error
        if g.finished:
            g.finish_time = time.perf_counter()
            self.tracker.retire(g)
            if self.on_group_finish is not None:
                self.on_group_finish(g)
            self._emit([req])
            if g.on_finish is not None:
                g.on_finish(g)

    def abort(self, rid: str) -> None:
        """Finish every completion of group ``rid`` with ``"abort"`` (no-op if unknown)."""
        g = self.tracker.get(rid)
        if g is None:
            return
        if not g.children:                     # still compiling its grammar
            self.tracker.stop_waiting(g)
            g.children.append(self.builder.placeholder(g))
        for r in list(g.children):
            self.finish(r, "abort")

    def fail_all(self, error: EngineError) -> None:
        """Abort every live group with ``error`` (the engine loop hit an error)."""
        for rid in self.tracker.rids():
            g = self.tracker.get(rid)
            if g is None:                      # finished while an earlier one was aborted
                continue
            g.error = error
            self.abort(rid)

    def _emit(self, reqs: Sequence[Request]) -> None:
        """Send each touched completion's new text; a finished group sends every pending
        delta of its children and then carries the final output on its last delta."""
        groups: dict[int, tuple[RequestGroup, list[Request]]] = {}
        for req in reqs:
            if req.group.sink is not None and not req.group.final_sent:
                groups.setdefault(id(req.group), (req.group, []))[1].append(req)
        for g, touched in groups.values():
            children = g.children if g.finished else list(dict.fromkeys(touched))
            deltas = [c.take_delta() for c in children]
            deltas = [d for d in deltas if d.text or d.token_ids or d.finished]
            if g.finished:
                if not deltas:
                    deltas = [g.children[-1].take_delta()]
                deltas[-1].output = g.output()
                g.final_sent = True
            for d in deltas:
                g.sink(d)
