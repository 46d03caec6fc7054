"""A deterministic backend for tests: answers depend only on the prompt and options.

Tokens are characters (``max_tokens=5`` yields at most 5 characters). Answers come from:

1. ``replies``: a dict whose keys are searched in the prompt — the key occurring latest wins
   (ties: the longer key) — or a callable ``prompt -> str | None``;
2. otherwise a pseudo-random text derived from a hash of the prompt.

Constraints are honoured: a regex/JSON schema/grammar/dtype gen returns the scripted reply if
it satisfies the constraint, else a deterministic sample that does. ``score`` gives 0.0 per
character to a continuation the scripted reply starts with (so ``select`` picks it) and
deterministic negative values otherwise. ``calls`` and ``prefix_events`` record every call.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from agentlang.backends.base import Backend, Capabilities, GenDelta, GenResult, Prompt
from agentlang.backends.mock_values import sample_grammar, sample_json, sample_regex
from agentlang.chat_template import ChatTemplate, chatml
from agentlang.sampling import SamplingOptions

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
_WORDS = ("alpha", "beta", "gamma", "delta", "echo", "fox", "golf", "hotel", "india", "juliet")


class MockCall(NamedTuple):
    kind: str            # "generate" | "stream" | "score"
    prompt: str
    options: Any         # SamplingOptions, or the continuations for "score"


def _rng(*parts: str) -> random.Random:
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


class Mock(Backend):
    capabilities = Capabilities()

    def __init__(self, replies: dict[str, str] | Callable[[str], str | None] | None = None, *,
                 default_system_prompt: str | None = DEFAULT_SYSTEM, chunk_size: int = 3,
                 delay_s: float = 0.0):
        if replies is not None and not (isinstance(replies, dict) or callable(replies)):
            raise ValueError("replies must be a dict {prompt substring: reply} or a callable")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.replies = replies
        self.chunk_size = chunk_size
        self.delay_s = delay_s
        self._template = chatml(default_system_prompt)
        self._lock = threading.Lock()
        self._handles = itertools.count(1)
        self.calls: list[MockCall] = []
        self.prefix_events: list[tuple[str, int, str]] = []  # ("cache"|"release", handle, text)
        self.locked: dict[int, str] = {}
        self.max_concurrent = 0
        self._in_flight = 0

    # -- interface ---------------------------------------------------------------------
    def chat_template(self) -> ChatTemplate:
        return self._template

    def generate(self, prompt: Prompt, opts: SamplingOptions) -> GenResult:
        self._record("generate", prompt.text, opts)
        self._enter()
        try:
            if self.delay_s:
                time.sleep(self.delay_s)
            return self._complete(prompt.text, opts)
        finally:
            self._leave()

    def stream(self, prompt: Prompt, opts: SamplingOptions) -> Iterator[GenDelta]:
        self._record("stream", prompt.text, opts)
        result = self._complete(prompt.text, opts)
        text = result.text
        for i in range(0, len(text), self.chunk_size):
            if self.delay_s:
                time.sleep(self.delay_s)
            last = i + self.chunk_size >= len(text)
            yield GenDelta(text[i:i + self.chunk_size], result if last else None)
        if not text:
            yield GenDelta("", result)

    def score(self, prefix: str, continuations: list[str]) -> list[list[float]]:
        self._record("score", prefix, tuple(continuations))
        reply = self.reply_for(prefix) if prefix else None
        out = []
        for cont in continuations:
            if reply is not None and cont and reply.startswith(cont):
                out.append([0.0] * len(cont))
            else:
                rng = _rng("score", prefix[-200:], cont)
                out.append([-1.0 - 4.0 * rng.random() for _ in cont] or [-10.0])
        return out

    def cache_prefix(self, text: str) -> int:
        with self._lock:
            handle = next(self._handles)
            self.locked[handle] = text
            self.prefix_events.append(("cache", handle, text))
        return handle

    def release_prefix(self, handle: Any) -> None:
        with self._lock:
            if handle not in self.locked:
                raise ValueError(f"unknown or already released prefix handle {handle!r}")
            self.prefix_events.append(("release", handle, self.locked.pop(handle)))

    def metrics(self) -> dict:
        with self._lock:
            return {"calls": len(self.calls), "locked_prefixes": len(self.locked),
                    "max_concurrent": self.max_concurrent}

    # -- helpers -----------------------------------------------------------------------
    def reply_for(self, prompt: str) -> str | None:
        """The scripted reply for ``prompt`` (None when nothing matches)."""
        if self.replies is None:
            return None
        if callable(self.replies):
            return self.replies(prompt)
        best, best_key = None, (-1, -1)
        for key, reply in self.replies.items():
            pos = prompt.rfind(key)
            if pos >= 0 and (pos + len(key), len(key)) > best_key:
                best, best_key = reply, (pos + len(key), len(key))
        return best

    def _record(self, kind: str, prompt: str, opts: Any) -> None:
        with self._lock:
            self.calls.append(MockCall(kind, prompt, opts))

    def _enter(self) -> None:
        with self._lock:
            self._in_flight += 1
            self.max_concurrent = max(self.max_concurrent, self._in_flight)

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _cached_tokens(self, prompt: str) -> int:
        with self._lock:
            return max((len(t) for t in self.locked.values() if prompt.startswith(t)), default=0)

    def _complete(self, prompt: str, opts: SamplingOptions) -> GenResult:
        reply = self.reply_for(prompt)
        rng = _rng("gen", prompt, repr(opts.json_schema), str(opts.regex), str(opts.value_type),
                   str(opts.seed))
        constrained = True
        if opts.json_schema is not None:
            text = sample_json(opts.json_schema_dict(), rng, reply)
        elif opts.regex is not None:
            text = sample_regex(opts.regex, rng, reply)
        elif opts.grammar is not None:
            text = reply if reply is not None else sample_grammar(opts.grammar, rng)
        elif opts.value_type is not None:
            text = self._typed(opts.value_type, rng, reply)
        else:
            constrained = False
            text = reply if reply is not None else " ".join(
                rng.choice(_WORDS) for _ in range(8))
        finish, matched = "stop", None
        if not constrained:
            for stop in opts.stop or ():
                pos = text.find(stop)
                if pos >= 0 and (matched is None or pos < text.find(matched)):
                    matched = stop
            if matched is not None:
                text = text[:text.find(matched)]
        limit = opts.max_tokens if opts.max_tokens is not None else len(text)
        if len(text) > limit:
            text, finish, matched = text[:limit], "length", None
        meta = {"prompt_tokens": len(prompt), "completion_tokens": len(text),
                "cached_tokens": self._cached_tokens(prompt)}
        logprobs = None
        if opts.logprobs is not None:
            logprobs = [(-0.5, ord(c), [(ord(c), -0.5)] * opts.logprobs) for c in text]
        return GenResult(text, finish, matched, meta, logprobs)

    @staticmethod
    def _typed(value_type: str, rng: random.Random, reply: str | None) -> str:
        if reply is not None:
            try:
                {"int": int, "float": float, "str": str,
                 "bool": lambda r: {"True": True, "False": False}[r]}[value_type](reply)
                return reply
            except (ValueError, KeyError):
                pass
        return {"int": lambda: str(rng.randint(0, 99)),
                "float": lambda: f"{rng.uniform(0, 10):.2f}",
                "bool": lambda: rng.choice(["True", "False"]),
                "str": lambda: '"' + rng.choice(_WORDS) + '"'}[value_type]()
