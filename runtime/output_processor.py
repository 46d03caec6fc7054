"""Processing one step's logits: commit KV, prompt logprobs, sampling, n>1 forks, stop
conditions, jump-forward, finishing and streaming deltas. Runs on the thread that steps.

Built from narrow parts: the request tracker (groups, pending grammars, counters), the
scheduler (queues, page release, prefix-cache insertion), the request builder (new
completions), the tokenizer (jump-forward drafts), the stop token ids and the context length.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from runtime.errors import EngineError, constraint_error
from runtime.request import Request, RequestGroup
from runtime.request_builder import RequestBuilder
from runtime.request_tracker import RequestTracker
from runtime.sampler import RowSpec, sample, top_logprobs
from runtime.scheduler import ScheduledItem, Scheduler


class OutputProcessor:
    def __init__(self, tracker: RequestTracker, scheduler: Scheduler, builder: RequestBuilder,
                 tokenizer: Any, eos_ids: set[int], max_context: int):
        self.tracker = tracker
        self.scheduler = scheduler
        self.builder = builder
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.max_context = max_context

    # ---- intake -----------------------------------------------------------------------
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
        sample_reqs: list[Request] = []
        sample_rows: list[int] = []
        drafts: list[tuple[Request, range, int]] = []
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
                self.finish(req, "stop")
                continue
            if req.draft:
                drafts.append((req, range(rows.stop - 1 - len(req.draft), rows.stop), it.start))
                continue
            for r in self._fork_if_first_sample(req):
                sample_reqs.append(r)
                sample_rows.append(rows.stop - 1)
                touched.append(r)
        if sample_reqs:
            specs = [self._spec(r) for r in sample_reqs]
            rows_t = torch.tensor(sample_rows, dtype=torch.long, device=logits.device)
            tokens, lps = sample(logits.index_select(0, rows_t), specs)
            for r, tok, lp, row in zip(sample_reqs, tokens, lps, sample_rows):
                self._append(r, tok, lp, raw_logits=logits[row])
        for req, rows, start in drafts:
            self._verify_draft(req, logits[rows.start:rows.stop], start)
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

    def _spec(self, req: Request, extra_output: Sequence[int] = ()) -> RowSpec:
        p = req.params
        output = req.output_ids + list(extra_output) if extra_output else req.output_ids
        banned: list[int] = []
        # min_tokens holds the end back, but never past a constraint that is complete and
        # admits nothing more: its mask allows only the end, so banning it leaves no token.
        if len(output) < p.min_tokens and not (req.matcher is not None
                                               and req.matcher.is_terminated()):
            banned = sorted(self.eos_ids | set(p.stop_token_ids))
        return RowSpec(p, req.generator, req.prompt_ids, output, banned, req.matcher,
                       p.logprobs)

    def _append(self, req: Request, tok: int, lp, matcher_accepted: bool = False,
                last: bool = True, raw_logits: torch.Tensor | None = None) -> bool:
        """Add a sampled token; returns whether the request finished. ``matcher_accepted``:
        the grammar matcher already consumed it and its budget guard settled it (and, unless
        ``last``, tokens after it, so its state says nothing about this position).
        ``raw_logits [V]``: the row it was sampled from, for the logprob of a forced token."""
        if req.matcher is not None and not matcher_accepted:
            accepted = req.matcher.accept_token(tok)
            assert accepted, f"grammar rejected sampled token {tok}"
            settled = self._settle(req, tok, 0)
            if settled != tok and lp is not None and raw_logits is not None:
                lp = top_logprobs(torch.log_softmax(raw_logits.float(), -1), settled, len(lp.top))
            tok = settled
        g = req.group
        if g.first_token_time is None:
            g.first_token_time = time.perf_counter()
        req.output_ids.append(tok)
        if req.logprobs is not None:
            req.logprobs.append(lp)
        self.tracker.count_generated()
        stop = req.out.append(tok)
        if self._check_finish(req, tok, stop, grammar_state=last):
            return True
        if not last:
            return False
        if req.matcher is not None and req.params.jump_forward and req.logprobs is None:
            from runtime.grammar.jump_forward import draft_tokens

            # Exact jump-forward: the grammar's forced text becomes a draft that the next
            # step runs in one extend and verifies against the model's own choices.
            budget = req.params.max_tokens - len(req.output_ids)
            req.draft = draft_tokens(req.matcher, self.tokenizer, max_tokens=min(32, budget))
        return False

    def _verify_draft(self, req: Request, logits: torch.Tensor, start: int) -> None:
        """logits [1 + len(draft), V]: row i follows ``[last token] + draft[:i]``."""
        from runtime.grammar.jump_forward import verify_draft

        draft, req.draft = req.draft, []

        def pick(i: int, row: torch.Tensor) -> int:
            spec = self._spec(req, extra_output=draft[:i])
            spec.matcher = None                      # verify_draft already masked the row
            # a copy: the row may be an inference-mode tensor, and sample() bans tokens in place
            return sample(row.clone(), [spec])[0][0]

        accepted = verify_draft(req.matcher, draft, logits, pick,
                                lambda i, tok: self._settle(req, tok, i))
        keep = start + len(accepted)                 # last token + matched draft have valid KV
        if req.num_computed > keep:
            req.page_table.truncate(keep)
            req.num_computed = keep
        req.passes_saved += len(accepted) - 1
        for i, tok in enumerate(accepted):
            if self._append(req, tok, None, matcher_accepted=True, last=i == len(accepted) - 1):
                return

    def _settle(self, req: Request, tok: int, ahead: int) -> int:
        """The budget guard's verdict on ``tok``, just accepted by the matcher as output token
        ``len(output_ids) + ahead``: ``tok`` itself, or the token forced in its place."""
        if req.budget is None:
            return tok
        n = len(req.output_ids) + ahead + 1                # output tokens including this one
        left = min(req.params.max_tokens - n, self.max_context - len(req.prompt_ids) - n)
        return req.budget.settle(req.matcher, tok, left).token

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
        g = req.group
        if error:
            g.error = error
        if g.finished:
            g.finish_time = time.perf_counter()
            self.tracker.retire(g)
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
