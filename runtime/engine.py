"""The in-process engine: tokenizer, scheduler, model runner, sampler and prefix cache.

``step()`` reads as three verbs: schedule → run → process outputs. Callers submit from any
thread: submissions and aborts go through an inbox drained at the start of each step, so the
engine state is only touched by whoever runs ``step()`` (the background loop once an async or
concurrent API started it, else the blocking call itself).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import queue
import random
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import torch

from runtime.attention.base import make_backend
from runtime.engine_config import EngineConfig
from runtime.kv_pool import KVLayout, KVPool
from runtime.model_loader import resolve_model
from runtime.model_runner import ModelRunner
from runtime.models.loading import load_model
from runtime.outputs import RequestOutput, StreamDelta
from runtime.output_processor import OutputProcessor
from runtime.page_allocator import PageAllocator
from runtime.page_table import memory_metrics
from runtime.prompts import PromptInput, normalize_prompts
from runtime.radix_cache import RadixCache
from runtime.request import Request, RequestGroup
from runtime.sampling_params import SamplingParams
from runtime.scheduler import Scheduler, SchedulerConfig


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
        self.model, self.tokenizer = load_model(resolved, cfg.weights, cfg.torch_dtype, self.device)
        self.model_config = mc = self.model.config
        self.kv_layout = KVLayout(mc.num_layers, mc.num_kv_heads, mc.head_dim, cfg.torch_dtype,
                                  cfg.kv_dtype)
        budget = cfg.kv_budget_mb if cfg.kv_budget_mb is not None else 512.0
        self.pool = KVPool(self.kv_layout, cfg.page_size, num_pages=cfg.num_pages,
                           budget_mb=budget, device=self.device)
        self.backend = make_backend(cfg.attention_backend, self.device)
        self.allocator = PageAllocator(self.pool.num_pages)
        self.cache = RadixCache(self.allocator, cfg.page_size, enabled=cfg.enable_prefix_cache)
        copy = lambda src, dst: self.backend.copy_pages(self.pool, src, dst)  # noqa: E731
        self.scheduler = Scheduler(
            SchedulerConfig(cfg.page_size, cfg.max_batch_tokens, cfg.max_running,
                            cfg.max_wait_steps), self.allocator, self.cache, copy)
        self.runner = ModelRunner(self.model, self.pool, self.backend)
        self.max_context = mc.max_position_embeddings
        self.eos_ids = set(mc.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            self.eos_ids.add(self.tokenizer.eos_token_id)
        # The effective KV storage dtype keys the prefix cache: pages stored at one precision
        # are never served to another.
        self.namespace_base = (self.model_name, str(cfg.torch_dtype), self.kv_layout.kv_dtype_name)
        self.processor = OutputProcessor(self)
        self._rng = random.Random(cfg.seed)
        self._ids = itertools.count()
        self._groups: dict[str, RequestGroup] = {}
        self._pending_grammar: list[RequestGroup] = []
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._step_lock = threading.RLock()
        self._wake = threading.Event()
        self._loop_thread: threading.Thread | None = None
        self._stop = False
        self.counters = {"prompt_tokens": 0, "generated_tokens": 0, "requests_finished": 0}
        self.peak_pages_used = 0
        self._grammar = None
        self._grammar_lock = threading.Lock()

    # ---- public API ---------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def generate(self, prompts: PromptInput, params: SamplingParams | Sequence[SamplingParams] | None = None):
        """Blocking. One prompt → one :class:`RequestOutput`; a list → a list, in order."""
        single, groups = self._make_groups(prompts, params)
        self._run_groups(groups)
        outs = [g.output() for g in groups]
        return outs[0] if single else outs

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> RequestOutput:
        return self.generate(messages, params)

    def generate_stream(self, prompt: PromptInput, params: SamplingParams | None = None,
                        request_id: str | None = None) -> Iterator[StreamDelta]:
        """Yields :class:`StreamDelta` objects; the last one carries ``output``."""
        _, (group,) = self._make_groups(prompt, params, request_id, single_only=True)
        q: queue.SimpleQueue[StreamDelta] = queue.SimpleQueue()
        group.sink = q.put
        self._submit(group)
        try:
            while True:
                if self._loop_thread is None:
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
                             request_id: str | None = None) -> RequestOutput:
        out = None
        async for d in self.async_stream(prompt, params, request_id):
            out = d.output or out
        return out

    async def async_stream(self, prompt: PromptInput, params: SamplingParams | None = None,
                           request_id: str | None = None) -> AsyncIterator[StreamDelta]:
        """Streams from the background loop; cancelling the consumer aborts the request."""
        _, (group,) = self._make_groups(prompt, params, request_id, single_only=True)
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
        self._inbox.put(lambda: self.processor.abort(request_id))
        self._wake.set()
        if self._loop_thread is None:
            self.step()

    def score(self, prefix: str | list[int], continuations: Sequence[str]) -> list[list[float]]:
        """Per-token logprobs of each continuation after ``prefix`` (prefix computed once)."""
        if not continuations:
            raise ValueError("continuations: must be a non-empty list of strings")
        pre = self._encode_one(prefix, "prefix")
        seqs = []
        for c in continuations:
            if not isinstance(c, str) or not c:
                raise ValueError(f"continuations: each must be a non-empty string, got {c!r}")
            full = self.tokenizer.encode(self.tokenizer.decode(pre) + c, add_special_tokens=False) \
                if isinstance(prefix, str) else pre + self.tokenizer.encode(c, add_special_tokens=False)
            if full[: len(pre)] != pre or len(full) == len(pre):
                full = pre + self.tokenizer.encode(c, add_special_tokens=False)
            seqs.append(full)
        handle = self.cache_prefix(pre) if len(pre) >= self.config.page_size else None
        try:
            groups = [self._new_group(s, SamplingParams(max_tokens=1), prefill_only=True,
                                      logprob_start=len(pre)) for s in seqs]
            self._run_groups(groups)
        finally:
            if handle is not None:
                self.release_prefix(handle)
        return [[lp for lp in g.prompt_logprobs[len(pre):]] for g in groups]

    def cache_prefix(self, prompt: str | list[int]) -> PrefixHandle:
        """Prefill ``prompt`` once, insert it into the radix cache and pin it there."""
        ids = self._encode_one(prompt, "prompt")
        handle = PrefixHandle(ids)
        g = self._new_group(ids, SamplingParams(max_tokens=1), prefill_only=True)

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
        self._inbox.put(lambda: self.cache.unlock(node))
        self._wake.set()
        if self._loop_thread is None:
            self.step()

    def flush_cache(self) -> int:
        """Free every unpinned page of the prefix cache; returns the pages freed."""
        with self._step_lock:
            return self.cache.flush()

    def metrics(self) -> dict[str, float]:
        tables = [t for t in (r.page_table for r in list(self.scheduler.running)) if t is not None]
        c = memory_metrics(self.cache, tables, self.scheduler.table_stats)
        used = self.allocator.num_used
        return {
            "prefix_cache_queried_tokens": c["prefix_queried_tokens"],
            "prefix_cache_hit_tokens": c["prefix_hit_tokens"],
            "prefix_cache_hit_rate": c["prefix_hit_rate"],
            "pages_total": self.allocator.num_pages,
            "pages_used": used,
            "pages_free": self.allocator.num_free,
            "peak_pages_used": max(self.peak_pages_used, used),
            "pages_evictable": self.cache.evictable_pages,
            "pages_protected": self.cache.protected_pages,
            "evictions": c["evicted_pages"],
            "cow_copies": c["cow_copies"],
            "kv_waste_pct": c["kv_waste_pct"],
            "preemptions": self.scheduler.preemptions,
            "tokens_run": self.runner.tokens_run,
            "forward_passes": self.runner.forward_passes,
            "prompt_tokens": self.counters["prompt_tokens"],
            "generated_tokens": self.counters["generated_tokens"],
            "requests_finished": self.counters["requests_finished"],
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting) + len(self._pending_grammar),
            "page_size": self.config.page_size,
        }

    def reset_peak(self) -> None:
        self.peak_pages_used = self.allocator.num_used

    # ---- the loop -----------------------------------------------------------------------
    def step(self) -> bool:
        """One scheduling step; returns whether work remains."""
        with self._step_lock:
            while not self._inbox.empty():
                self._inbox.get()()
            self.processor.admit_ready_grammars()
            items = self.scheduler.schedule()
            for req in self.scheduler.failed:
                self.processor.finish(req, "length", error="request does not fit in the KV pool")
            self.scheduler.failed.clear()
            if items:
                self.peak_pages_used = max(self.peak_pages_used, self.allocator.num_used)
                logits = self.runner.run(items)
                self.processor.process(items, logits)
            return self.scheduler.has_work or bool(self._pending_grammar)

    def start_background_loop(self) -> None:
        if self._loop_thread is not None:     # fast path: never wait for a running step
            return
        with self._step_lock:
            if self._loop_thread is not None:
                return
            self._stop = False
            self._loop_thread = threading.Thread(target=_drive, args=(weakref.ref(self),),
                                                 name="agentlang-engine",
                                                 daemon=True)
            self._loop_thread.start()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        thread, self._loop_thread = self._loop_thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def _loop_once(self) -> None:
        try:
            busy = self.step()
        except Exception as e:  # keep serving: fail the running requests, not the loop
            self.processor.fail_all(f"engine error: {type(e).__name__}: {e}")
            busy = False
        if not busy:
            self._wake.wait(timeout=0.05)
            self._wake.clear()

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
        self._run_until(done)

    def _run_until(self, done: threading.Event) -> None:
        if self._loop_thread is not None:
            done.wait()
            return
        while not done.is_set():
            self.step()

    def _submit(self, group: RequestGroup) -> None:
        self._inbox.put(lambda: self.processor.add(group))
        self._wake.set()

    # ---- request construction -----------------------------------------------------------
    def _encode_one(self, prompt: str | list[int], field: str) -> list[int]:
        _, ids = normalize_prompts(prompt, self.tokenizer, self.model_config.vocab_size, field,
                                   single_only=True)
        return ids[0]

    def _make_groups(self, prompts, params, request_id: str | None = None,
                     single_only: bool = False) -> tuple[bool, list[RequestGroup]]:
        single, ids = normalize_prompts(prompts, self.tokenizer, self.model_config.vocab_size,
                                        "prompt", single_only=single_only,
                                        chat=self.apply_chat_template)
        if params is None:
            params = SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(ids)
        if len(plist) != len(ids):
            raise ValueError(f"params: got {len(plist)} SamplingParams for {len(ids)} prompts")
        for p in plist:
            if not isinstance(p, SamplingParams):
                raise ValueError(f"params: expected SamplingParams, got {type(p).__name__}")
        groups = [self._new_group(i, p, rid=request_id) for i, p in zip(ids, plist)]
        return single, groups

    def _new_group(self, ids: list[int], params: SamplingParams, rid: str | None = None,
                   prefill_only: bool = False, logprob_start: int | None = None) -> RequestGroup:
        if len(ids) >= self.max_context:
            raise ValueError(f"prompt: {len(ids)} tokens, the model's context is "
                             f"{self.max_context} tokens")
        if len(ids) + 1 > self.pool.capacity_tokens:
            raise ValueError(f"prompt: {len(ids)} tokens do not fit the KV pool "
                             f"({self.pool.capacity_tokens} tokens; raise kv_budget_mb)")
        if params.prompt_logprobs is not None and logprob_start is None:
            logprob_start = 1
        ns = self.namespace_base + ((params.cache_salt,) if params.cache_salt else ())
        group = RequestGroup(rid or f"req-{next(self._ids)}", ids, params, ns,
                             prefill_only=prefill_only, logprob_start=logprob_start)
        self.processor.prepare(group)   # compiles constraints; raises ValueError on bad ones
        return group

    def grammar_cache(self):
        """The compiled-grammar cache (created on first use: most engines never need it)."""
        with self._grammar_lock:
            return self._grammar_cache_locked()

    def _grammar_cache_locked(self):
        if self._grammar is None:
            from runtime.grammar.base import make_grammar_backend
            from runtime.grammar.cache import GrammarCache

            backend = make_grammar_backend(self.config.grammar_backend, self.tokenizer,
                                           self.model_config.vocab_size,
                                           stop_token_ids=sorted(self.eos_ids))
            self._grammar = GrammarCache(backend)
        return self._grammar

    def new_generator(self, seed: int | None, index: int) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed((seed + index) if seed is not None else self._rng.getrandbits(62))
        return g

    def __del__(self):
        try:
            self.shutdown()
        except Exception:
            pass


def _drive(ref: "weakref.ref[Engine]") -> None:
    """The background loop. Holds the engine only weakly between steps, so an engine nobody
    references any more is collected and its loop ends; at interpreter exit it stops cleanly
    (no thread is left inside a torch op while the process tears down)."""
    atexit.register(_stop_at_exit, ref)
    while True:
        engine = ref()
        if engine is None or engine._stop:
            return
        engine._loop_once()
        del engine


def _stop_at_exit(ref: "weakref.ref[Engine]") -> None:
    engine = ref()
    if engine is not None:
        engine.shutdown()
