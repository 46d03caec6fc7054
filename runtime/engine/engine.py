"""The in-process engine: wiring of tokenizer, scheduler, model runner, sampler and prefix
cache, plus the public API and the step.

``step()`` drains the inbox, then runs :class:`StepCore`'s step — schedule → run → process
outputs, the one copy of it (the model-free tests build the same class). Callers submit from any
thread: submissions and aborts go through the :class:`StepLoop` inbox drained at the start of
each step, so the engine state is only touched by whoever runs ``step()`` (the background loop
once an async or concurrent API started it, else the blocking call itself). Owners: requests
in flight — :class:`RequestTracker`; building them — :class:`RequestBuilder`; queues, pages and
preemption — :class:`Scheduler`; logits to tokens, finishing, streaming —
:class:`OutputProcessor`; the step, its metrics and snapshot — :class:`StepCore`.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from functools import partial
from typing import Any

import torch

from agentlang.runtime.chat.family import render
from agentlang.runtime.core.agent_stats import AgentStats
from agentlang.runtime.attention.base import make_backend
from agentlang.runtime.execution.cuda_graph import make_decode_graphs
from agentlang.runtime.engine.config import EngineConfig
from agentlang.runtime.engine.step_core import StepCore
from agentlang.runtime.engine.step_loop import StepLoop
from agentlang.runtime.engine.sessions import EngineSessions
from agentlang.runtime.session.registry import SessionRegistry
from agentlang.runtime.core.errors import EngineError, ErrorCode
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.weights.model_loader import resolve_model
from agentlang.runtime.execution.model_runner import ModelRunner
from agentlang.runtime.models.loading import load_model
from agentlang.runtime.core.openmp_pool import release_thread_pool
from agentlang.runtime.request.outputs import RequestOutput, StreamDelta
from agentlang.runtime.engine.output_processor import OutputProcessor
from agentlang.runtime.cache.page_allocator import PageAllocator
from agentlang.runtime.request.limits import RequestLimits
from agentlang.runtime.request.prompts import PromptInput
from agentlang.runtime.cache.radix_cache import RadixCache
from agentlang.runtime.request.request import RequestGroup
from agentlang.runtime.engine.request_builder import LazyGrammarCache, RequestBuilder
from agentlang.runtime.engine.request_tracker import RequestTracker
from agentlang.runtime.sampling.params import SamplingParams
from agentlang.runtime.scheduler.scheduler import Scheduler
from agentlang.runtime.speculative import DraftPolicy
from agentlang.runtime.speculative.calibrate import measure_row_cost


class PrefixHandle:
    """A prompt prefix prefilled and pinned in the radix cache until ``release_prefix``."""

    def __init__(self, token_ids: list[int]):
        self.token_ids = token_ids
        self.node = None
        self.released = False


class Engine:
    def __init__(self, model: str = "default", **kwargs: Any):
        self.config = cfg = EngineConfig(model=str(model), **kwargs)
        cfg.validate()
        resolved = resolve_model(cfg.model, cfg.weights)
        self.model_name = resolved.name
        self.model_path = resolved.path
        self.device = torch.device(cfg.device)
        self.model, self.tokenizer, self.hf_dir = load_model(resolved, cfg.weights,
                                                             cfg.torch_dtype, self.device,
                                                             cfg.bf16_gemm_rows)
        self.model_config = mc = self.model.config
        self.kv_layout = KVLayout(mc.num_layers, mc.num_kv_heads, mc.head_dim, cfg.torch_dtype,
                                  cfg.kv_dtype, mc.layer_windows)
        budget = cfg.kv_budget_mb if cfg.kv_budget_mb is not None else 512.0
        self.pool = KVPool(self.kv_layout, cfg.page_size, cfg.num_pages, budget, self.device,
                           cfg.window_kv_fraction, cfg.max_batch_tokens)
        self.backend = make_backend(cfg.attention_backend, self.device, cfg.bf16_gemm_rows)
        self.allocator = PageAllocator(self.pool.num_pages, self.pool.windows)
        self.cache = RadixCache(self.allocator, cfg.page_size, enabled=cfg.enable_prefix_cache)
        copy = lambda src, dst: self.backend.copy_pages(self.pool, src, dst)  # noqa: E731
        self.scheduler = Scheduler(cfg.scheduler_config(self.pool.num_pages), self.allocator,
                                   self.cache, copy)
        graphs = make_decode_graphs(cfg.cuda_graph, self.model, self.pool, self.backend,
                                    self.allocator, cfg.max_running, mc.max_position_embeddings)
        self.runner = ModelRunner(self.model, self.pool, self.backend, graphs)
        self.max_context = mc.max_position_embeddings
        self.eos_ids = set(mc.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)
        # The effective KV storage dtype keys the prefix cache: pages stored at one precision
        # are never served to another.
        self.namespace_base = (self.model_name, str(cfg.torch_dtype), self.kv_layout.kv_dtype_name)
        self.grammars = LazyGrammarCache(self._make_grammar_cache)
        self.limits = RequestLimits(mc.vocab_size, self.max_context, self.pool.capacity_tokens)
        registry = SessionRegistry(self.max_context, cfg.max_sessions, cfg.session_timeout_s)
        self.builder = RequestBuilder(self.tokenizer, self.limits, self.namespace_base,
                                      self.grammars, cfg.seed, registry)
        self.agent_stats = AgentStats(cfg.max_agent_labels)   # per-label totals (/metrics)
        self.tracker = RequestTracker(self.agent_stats)
        measure = partial(measure_row_cost, self.model, self.pool, self.allocator, self.backend,
                          self.max_context)       # the row cost, at the policy's first draft
        self.processor = OutputProcessor(self.tracker, self.scheduler, self.builder,
                                         self.tokenizer, self.eos_ids, self.max_context,
                                         DraftPolicy(cfg.speculative_max_draft,
                                                     cfg.speculative_row_cost, measure),
                                         cfg.speculative, cfg.speculative_shared_cap)
        self.step_loop = StepLoop(self.step, self._fail_all)
        # sessions: open / close / SGLang turns (engine.sessions.open(...), ...)
        self.sessions = EngineSessions(registry, self.scheduler, self.builder.namespace,
                                       self.abort, cfg.session_hold_s,
                                       self.tokenizer.bos_token_id, self.step_loop.lock)
        self.processor.on_group_finish = self.sessions.finished
        self.core = StepCore(self.scheduler, self.processor, self.tracker, self.allocator,
                             self.cache, self.runner, self.step_loop.take_arrivals,
                             self.sessions, self.step_loop.pending)
        release_thread_pool()     # the loader's OpenMP workers: the stepping thread owns its own

    # ---- public API ---------------------------------------------------------------------
    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> RequestOutput:
        return self.generate(messages, params)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kw) -> str:
        return render(self.tokenizer, messages, add_generation_prompt, **kw)   # kw: tools, enable_thinking, ...

    def generate(self, prompts: PromptInput, params: SamplingParams | Sequence[SamplingParams] | None = None,
                 prefill_only: bool = False):
        """Blocking. One prompt → one :class:`RequestOutput`; a list → a list, in order.
        ``prefill_only``: compute and cache the prompt's KV (and its ``prompt_logprobs`` if
        asked), sample nothing: no output tokens, ``finish_reason`` ``"length"``."""
        single, groups = self._make_groups(prompts, params, prefill_only=prefill_only)
        self._run_groups(groups)
        outs = [g.output() for g in groups]
        return outs[0] if single else outs

    def generate_stream(self, prompt: PromptInput, params: SamplingParams | None = None,
                        request_id: str | None = None) -> Iterator[StreamDelta]:
        """Yields :class:`StreamDelta` objects; the last one carries ``output``."""
        _, (group,) = self._make_groups(prompt, params, request_id, single_only=True)
        q: queue.SimpleQueue[StreamDelta] = queue.SimpleQueue()
        group.sink = q.put
        self._submit(group)
        if self.step_loop.running:
            release_thread_pool()        # this thread only waits: see agentlang.runtime.core.openmp_pool
        try:
            while True:
                if not self.step_loop.running:
                    while q.empty():
                        self.step()
                d = q.get()
                yield d
                if d.output is not None:
                    return
        finally:
            if not group.finished:
                self.abort(group.rid)

    async def async_generate(self, prompt: PromptInput, params: SamplingParams | None = None,
                             request_id: str | None = None,
                             prefill_only: bool = False) -> RequestOutput:
        out = None
        async for d in self.async_stream(prompt, params, request_id, prefill_only):
            out = d.output or out
        return out

    async def async_stream(self, prompt: PromptInput, params: SamplingParams | None = None,
                           request_id: str | None = None,
                           prefill_only: bool = False) -> AsyncIterator[StreamDelta]:
        """Streams from the background loop; cancelling the consumer aborts the request
        (``prefill_only``: see :meth:`generate`)."""
        _, (group,) = self._make_groups(prompt, params, request_id, single_only=True,
                                        prefill_only=prefill_only)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[StreamDelta] = asyncio.Queue()
        group.sink = lambda d: loop.call_soon_threadsafe(q.put_nowait, d)
        self.start_background_loop()
        self._submit(group)
        try:
            while True:
                d = await q.get()
                yield d
                if d.output is not None:
                    return
        finally:
            if not group.finished:
                self.abort(group.rid)

    def abort(self, request_id: str) -> None:
        """Finish a request with ``finish_reason="abort"`` and free everything it holds."""
        self._post_now(lambda: self.processor.abort(request_id))

    def score(self, prefix: str | list[int], continuations: Sequence[str]) -> list[list[float]]:
        """Per-token logprobs of each continuation after ``prefix`` (prefix computed once)."""
        pre = self.builder.encode_one(prefix, "prefix")
        seqs = self.builder.continuations(prefix, pre, continuations)
        handle = self.cache_prefix(pre) if len(pre) >= self.config.page_size else None
        try:
            groups = [self.builder.group(s, SamplingParams(max_tokens=1), prefill_only=True,
                                         logprob_start=len(pre)) for s in seqs]
            self._run_groups(groups)
        finally:
            if handle is not None:
                self.release_prefix(handle)
        return [[lp for lp in g.prompt_logprobs[len(pre):]] for g in groups]

    def cache_prefix(self, prompt: str | list[int]) -> PrefixHandle:
        """Prefill ``prompt`` once, insert it into the radix cache and pin it there."""
        ids = self.builder.encode_one(prompt, "prompt")
        handle = PrefixHandle(ids)
        g = self.builder.group(ids, SamplingParams(max_tokens=1), prefill_only=True)

        def pin(grp: RequestGroup) -> None:   # runs on the stepping thread, at the finish
            m = self.cache.match_prefix(ids, grp.namespace, record=False)
            self.cache.lock(m.node)
            handle.node = m.node

        self._run_groups([g], then=pin)
        return handle

    def release_prefix(self, handle: PrefixHandle) -> None:
        if handle.released:
            raise ValueError("release_prefix: this prefix handle was already released")
        handle.released = True
        node = handle.node
        self._post_now(lambda: self.cache.unlock(node))

    def flush_cache(self) -> int:
        """Free every unpinned page of the prefix cache (session holds released first);
        returns the pages freed."""
        with self.step_loop.lock:
            self.scheduler.retention.release_all("flushed")
            return self.cache.flush()

    def metrics(self) -> dict[str, float]:
        """A consistent snapshot: read under the step's lock, never mid-step."""
        with self.step_loop.lock:
            return self.core.metrics()

    def snapshot(self, max_nodes: int = 500, pages: bool = True):
        """A consistent copy of the live state (metrics, up to ``max_nodes`` radix-tree nodes,
        page refcounts, requests, recent evictions), taken between steps under the step
        lock; see :mod:`agentlang.runtime.engine.snapshot` (its ``cost_ms`` is the engine-thread cost)."""
        from agentlang.runtime.engine.snapshot import check_max_nodes

        check_max_nodes(max_nodes)
        with self.step_loop.lock:
            return self.core.snapshot(max_nodes, pages)

    def reset_peak(self) -> None:
        self.core.reset_peak()

    # ---- the loop -----------------------------------------------------------------------
    def step(self) -> bool:
        """One scheduling step; returns whether work remains."""
        with self.step_loop.lock:
            self.step_loop.drain()
            return self.core.step()

    def start_background_loop(self) -> None:
        self.step_loop.start()

    def shutdown(self) -> None:
        self.step_loop.shutdown()

    def _fail_all(self, exc: Exception) -> None:
        self.processor.fail_all(EngineError(ErrorCode.ENGINE_FAILURE, None,
                                            f"engine error: {type(exc).__name__}: {exc}"))

    def _post_now(self, change: Callable[[], None]) -> None:
        """Queue ``change`` for the stepping thread; step here if no thread does."""
        self.step_loop.post(change)
        if not self.step_loop.running:
            self.step()

    def _run_groups(self, groups: list[RequestGroup],
                    then: Callable[[RequestGroup], None] | None = None) -> None:
        """Submit ``groups`` and block until all finished (``then`` runs at each finish)."""
        done = threading.Event()
        left = [len(groups)]

        def finished(g: RequestGroup) -> None:
            if then is not None:
                then(g)
            left[0] -= 1
            if left[0] == 0:
                done.set()

        for g in groups:
            g.on_finish = finished
            self._submit(g)
        self.step_loop.run_until(done)

    def _submit(self, group: RequestGroup) -> None:
        self.step_loop.post(lambda: self.processor.add(group), arrival=True)

    def _make_groups(self, prompts, params, request_id: str | None = None,
                     single_only: bool = False,
                     prefill_only: bool = False) -> tuple[bool, list[RequestGroup]]:
        return self.builder.groups(prompts, params, self.apply_chat_template, request_id,
                                   single_only, prefill_only)

    def grammar_cache(self):
        """The compiled-grammar cache (created on first use: most engines never need it)."""
        return self.grammars.get()

    def compile_constraint(self, params: SamplingParams, budget_field: str = "max_tokens"):
        """Compile and check ``params``' constraint as submit would (blocking; see
        :meth:`RequestBuilder.compile_constraint`): a caller that must refuse bad constraints
        before submitting (the server) calls this first, and submit then reuses its work."""
        return self.builder.compile_constraint(params, budget_field)

    def _make_grammar_cache(self):
        from agentlang.runtime.grammar.base import make_grammar_backend
        from agentlang.runtime.grammar.cache import GrammarCache

        backend = make_grammar_backend(self.config.grammar_backend, self.tokenizer,
                                       self.model_config.vocab_size,
                                       stop_token_ids=sorted(self.eos_ids))
        return GrammarCache(backend)

    def __del__(self):
        try:
            self.shutdown()
        except Exception:
            pass

