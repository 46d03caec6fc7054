"""Building requests: user prompts and sampling parameters become :class:`RequestGroup` s
(validated, namespaced, constraint compilation started) on the caller's thread, and a group's
completions become :class:`Request` s (detokenizer, generator, grammar matcher) on the thread
that steps the engine.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import torch

from agentlang.runtime.request.detokenizer import OutputText
from agentlang.runtime.request.limits import RequestLimits
from agentlang.runtime.request.prompts import PromptInput, normalize_prompts
from agentlang.runtime.request.request import Request, RequestGroup
from agentlang.runtime.sampling.params import SamplingParams
from agentlang.runtime.session.registry import SessionRegistry

if TYPE_CHECKING:
    from agentlang.runtime.grammar.base import CompiledGrammar
    from agentlang.runtime.grammar.cache import GrammarCache


class LazyGrammarCache:
    """The compiled-grammar cache, created on first use (most engines never need one).
    ``make`` builds it; :meth:`get` is safe from any thread."""

    def __init__(self, make: Callable[[], "GrammarCache"]):
        self._make = make
        self._cache: GrammarCache | None = None
        self._lock = threading.Lock()

    def get(self) -> "GrammarCache":
        with self._lock:
            if self._cache is None:
                self._cache = self._make()
            return self._cache


class RequestBuilder:
    """Validates prompts against the model and the KV pool (``limits``, the checks the server
    also makes before answering), names groups ``req-N`` unless given an id, and keys their cache
    entries by ``namespace_base`` plus the request's ``cache_salt``. ``seed`` seeds the
    generators of requests that set no seed of their own. A request with a ``session`` joins
    it in ``sessions`` (opened on first use) within the session's capacity."""

    def __init__(self, tokenizer: Any, limits: RequestLimits, namespace_base: tuple,
                 grammars: LazyGrammarCache, seed: int | None,
                 sessions: SessionRegistry | None = None):
        self.tokenizer = tokenizer
        self.sessions = sessions
        self.limits = limits
        self.namespace_base = namespace_base
        self.grammars = grammars
        self._rng = random.Random(seed)
        self._ids = itertools.count()

    # ---- groups (caller thread) ---------------------------------------------------------
    def encode_one(self, prompt: str | list[int], field: str) -> list[int]:
        """One prompt (text or token ids) as validated token ids; ``field`` names it in errors."""
        _, ids = normalize_prompts(prompt, self.tokenizer, self.limits, field,
                                   single_only=True)
        return ids[0]

    def groups(self, prompts: PromptInput, params: SamplingParams | Sequence[SamplingParams] | None,
               chat: Callable[[list[dict]], str], request_id: str | None = None,
               single_only: bool = False,
               prefill_only: bool = False) -> tuple[bool, list[RequestGroup]]:
        """One group per prompt; ``params`` is shared or one per prompt. Returns whether a
        single prompt (not a list) was given. Raises ``ValueError`` naming the bad field."""
        single, ids = normalize_prompts(prompts, self.tokenizer, self.limits, "prompt",
                                        single_only=single_only, chat=chat)
        if params is None:
            params = SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(ids)
        if len(plist) != len(ids):
            raise ValueError(f"params: got {len(plist)} SamplingParams for {len(ids)} prompts")
        for p in plist:
            if not isinstance(p, SamplingParams):
                raise ValueError(f"params: expected SamplingParams, got {type(p).__name__}")
        return single, [self.group(i, p, rid=request_id, prefill_only=prefill_only)
                        for i, p in zip(ids, plist)]

    def continuations(self, prefix: str | list[int], pre: list[int],
                      continuations: Sequence[str]) -> list[list[int]]:
        """Token ids of ``prefix`` (encoded as ``pre``) followed by each continuation (the
        continuation re-tokenized with a text prefix when that keeps ``pre`` intact)."""
        if not continuations:
            raise ValueError("continuations: must be a non-empty list of strings")
        tok, seqs = self.tokenizer, []
        for c in continuations:
            if not isinstance(c, str) or not c:
                raise ValueError(f"continuations: each must be a non-empty string, got {c!r}")
            full = tok.encode(tok.decode(pre) + c, add_special_tokens=False) \
                if isinstance(prefix, str) else pre + tok.encode(c, add_special_tokens=False)
            if full[: len(pre)] != pre or len(full) == len(pre):
                full = pre + tok.encode(c, add_special_tokens=False)
            seqs.append(full)
        return seqs

    def group(self, ids: list[int], params: SamplingParams, rid: str | None = None,
              prefill_only: bool = False, logprob_start: int | None = None) -> RequestGroup:
        """A group for validated token ids; its constraint (if any) starts compiling."""
        self.limits.check_prompt(len(ids))
        if params.prompt_logprobs is not None and logprob_start is None:
            logprob_start = 1
        ns = self.namespace(params.cache_salt)
        if params.next_use_s is not None and params.session is None and params.tool_calls is None:
            raise ValueError("next_use_s: a hint for a request whose KV is kept for its next "
                             "use: give it a session (session_id) or tools")
        session = None
        if params.session is not None and self.sessions is not None:
            session = (ns, self.sessions.join(ns, params.session, len(ids), params.max_tokens))
        grammar = self.compile_constraint(params, check_budget=not prefill_only)
        return RequestGroup(rid or f"req-{next(self._ids)}", ids, params, ns,
                            prefill_only=prefill_only, logprob_start=logprob_start,
                            grammar=grammar, session=session)

    def namespace(self, cache_salt: str | None) -> tuple:
        """The prefix-cache namespace of requests with ``cache_salt``."""
        return self.namespace_base + ((cache_salt,) if cache_salt else ())

    def compile_constraint(self, params: SamplingParams, budget_field: str = "max_tokens",
                           check_budget: bool = True) -> Future[CompiledGrammar] | None:
        """The one place a request's constraint is compiled (``None`` when it has none): the
        constraint normalised once by ``params.constraint``, compiled once per engine by the
        grammar cache (later requests with an equal constraint share it). With
        ``params.complete_within_budget`` and ``check_budget`` this waits for the compilation
        and refuses, before anything is queued, a constraint no output satisfies
        (``UnsatisfiableConstraint``) and a budget below its shortest valid output
        (``BudgetTooSmall`` naming ``budget_field``; the minimum is searched once per compiled
        grammar). Other compile failures (a constraint this backend does not support) are left
        in the returned future. ``ValueError`` naming the field for a bad constraint. Any
        thread (the server calls it off its event loop first, so submit finds all of it done)."""
        c = params.constraint
        if c is None:
            return None
        fut = self.grammars.get().submit(c)
        if params.complete_within_budget and check_budget:
            from agentlang.runtime.grammar.budget import check_budget as check

            try:
                compiled = fut.result()
            except ValueError:
                return fut
            check(compiled, params.max_tokens, budget_field, params.constraint_field())
        return fut

    # ---- requests (stepping thread) ------------------------------------------------------
    def request(self, group: RequestGroup, index: int) -> Request:
        """Completion ``index`` of ``group``. Raises what the grammar compilation raised."""
        p = group.params
        matcher = budget = None
        if group.grammar is not None:
            compiled = group.grammar.result()    # prefill only: checked, never applied
        if group.grammar is not None and not group.prefill_only:
            matcher = compiled.new_matcher()
            if p.complete_within_budget:
                from agentlang.runtime.grammar.budget import BudgetGuard

                budget = BudgetGuard(compiled, matcher)
        return Request(group, index,
                       OutputText(self.tokenizer, p.stop, p.include_stop_str_in_output,
                                  p.skip_special_tokens),
                       self.generator(p.seed, index), matcher,
                       logprobs=[] if p.logprobs is not None else None, budget=budget)

    def placeholder(self, group: RequestGroup) -> Request:
        """A bare completion 0 for a group that never starts (failed or aborted before its
        grammar was ready), so it can be finished and reported."""
        return Request(group, 0, OutputText(self.tokenizer), None)

    def generator(self, seed: int | None, index: int) -> torch.Generator:
        """Completion ``index``'s sampling generator: ``seed + index``, or a fresh random seed."""
        g = torch.Generator()
        g.manual_seed((seed + index) if seed is not None else self._rng.getrandbits(62))
        return g
