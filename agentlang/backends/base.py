"""The one interface every backend implements (in-process engine, our server, OpenAI, Mock).

A backend is shared by many program threads at once; every method must be thread-safe.
The interpreter calls:

- ``chat_template()`` once per run, to render roles;
- ``generate(prompt, opts)`` / ``stream(prompt, opts)`` for ``gen``;
- ``score(prefix, continuations)`` for ``select``;
- ``cache_prefix(text)`` / ``release_prefix(handle)`` around forks and batches, only when
  ``capabilities.prefix_cache`` is true;
- ``check(opts)`` before a generation: a feature the backend cannot honour raises
  ``UnsupportedFeatureError`` instead of being silently dropped;
- ``end_run(run_id)`` when a program run ended (its session, if the backend keeps one, closes);
- ``next_use(run_id, seconds)`` before a tool of the run runs: when it will generate again.

Sessions: a backend whose engine keeps KV per session (``Runtime``, ``RuntimeEndpoint`` on
``agentlang serve``) makes each program run one — :func:`session_of` names it after the run —
so the run's history stays cached while its tools run, and is let go when the run ends.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from agentlang.chat_template import ChatTemplate
from agentlang.sampling import SamplingOptions


class UnsupportedFeatureError(ValueError):
    """The backend cannot honour a requested feature (named in the message)."""


class Prompt(NamedTuple):
    """What a generation continues. ``text`` is the full rendered prompt; chat-only backends
    use ``messages`` (finished messages) plus the role currently open and its text so far."""

    text: str
    messages: tuple[dict, ...] = ()
    open_role: str | None = None
    open_text: str = ""
    tag: dict | None = None           # which run / branch asks (ProgramTag.as_dict); servers
    #                                   that show programs (our dashboard) read it, others ignore


def run_session(run_id: str) -> str:
    """The session id of program run ``run_id``."""
    return f"run-{run_id}"


def session_of(tag: dict | None) -> str | None:
    """The session of the program run a ``Prompt.tag`` names (``None`` without a run tag)."""
    return run_session(tag["id"]) if tag and tag.get("id") else None


class GenResult(NamedTuple):
    text: str
    finish_reason: str                # "stop" | "length" | "abort"
    matched_stop: str | int | None = None
    meta: dict = {}                   # prompt_tokens, completion_tokens, cached_tokens, …
    token_logprobs: list | None = None  # [(logprob, token_id, top: list[(token_id, logprob)])]


class GenDelta(NamedTuple):
    text: str                         # newly generated text
    result: GenResult | None = None   # set on the last delta only


@dataclass(frozen=True)
class Capabilities:
    regex: bool = True
    json_schema: bool = True
    grammar: bool = True
    value_type: bool = True
    logprobs: bool = True
    score: bool = True
    prefix_cache: bool = True
    stream: bool = True
    stop_token_ids: bool = True
    extended_sampling: bool = True    # top_k, min_p, min_tokens, ignore_eos, repetition_penalty
    text_prompt: bool = True          # False: chat-only API; gen must open an assistant turn
    priority: bool = True             # honours a scheduling priority
    tool_calls: bool = False          # a family's call constraint (the in-process runtime)


# The sampling fields vLLM and SGLang add to the OpenAI API, and the values that mean "not
# asked for" (a backend without ``Capabilities.extended_sampling`` refuses the others)
EXTENDED_SAMPLING = {"top_k": (None, 0, -1), "min_p": (None, 0.0), "min_tokens": (None, 0),
                     "ignore_eos": (None, False), "repetition_penalty": (None, 1.0)}


def extended_fields(opts: SamplingOptions) -> dict[str, Any]:
    """The :data:`EXTENDED_SAMPLING` fields ``opts`` asks for, by name, in that order."""
    return {name: getattr(opts, name) for name, unset in EXTENDED_SAMPLING.items()
            if getattr(opts, name) not in unset}


class Backend(ABC):
    """Base class; subclasses set ``capabilities`` and implement the abstract methods."""

    capabilities: Capabilities = Capabilities()

    @abstractmethod
    def chat_template(self) -> ChatTemplate:
        """Role markers used to render system/user/assistant blocks into text."""

    @abstractmethod
    def generate(self, prompt: Prompt, opts: SamplingOptions) -> GenResult:
        """One completion of ``prompt`` under fully resolved ``opts``."""

    def tool_format(self) -> str | None:
        """How the model's family writes a tool call (a key of
        ``agentlang.runtime.grammar.tool_format.FORMATS``, e.g. ``"hermes"``) when the
        backend knows it; ``None``: the bare JSON ``{"name", "arguments"}`` object."""
        return None

    def stream(self, prompt: Prompt, opts: SamplingOptions) -> Iterator[GenDelta]:
        """Incremental generation; default: the whole result as one delta."""
        result = self.generate(prompt, opts)
        yield GenDelta(result.text, result)

    def score(self, prefix: str, continuations: list[str]) -> list[list[float]]:
        """Per-token logprobs of each continuation after ``prefix`` (prefix computed once)."""
        raise UnsupportedFeatureError(f"{type(self).__name__} cannot score continuations by "
                                      f"log-probability, so select() is unavailable")

    def cache_prefix(self, text: str) -> Any:
        """Prefill ``text`` and keep it cached (locked) until ``release_prefix(handle)``."""
        raise UnsupportedFeatureError(f"{type(self).__name__} has no prefix cache")

    def release_prefix(self, handle: Any) -> None:
        raise UnsupportedFeatureError(f"{type(self).__name__} has no prefix cache")

    def metrics(self) -> dict:
        return {}

    default_priority: int | None = None   # a run's priority when it sets none

    def set_default_priority(self, priority: int | None) -> None:
        """The priority of every generation whose run sets none (None: the server's, 0)."""
        if priority is not None:
            from agentlang.sampling import check_scheduling

            check_scheduling(priority, None)
            if not self.capabilities.priority:
                raise UnsupportedFeatureError(f"{type(self).__name__} cannot honour priority")
        self.default_priority = priority

    def priority_of(self, opts: SamplingOptions) -> int | None:
        """The run's priority, else this backend's default (None: leave it to the server)."""
        return opts.priority if opts.priority is not None else self.default_priority

    def end_run(self, run_id: str) -> None:
        """Program run ``run_id`` ended: what the backend kept for it can go (default: none)."""

    def next_use(self, run_id: str, seconds: float) -> None:
        """Program run ``run_id`` will generate again in about ``seconds`` (a tool of it runs):
        a next-use hint for what the backend keeps for it (default: ignored). Best effort:
        never raises for a run that has nothing kept."""

    def close(self) -> None:
        """Release resources (threads, connections, engines). Idempotent."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check(self, opts: SamplingOptions) -> None:
        """Raise UnsupportedFeatureError for options this backend would have to ignore."""
        caps, name = self.capabilities, type(self).__name__
        wanted = [
            ("regex", opts.regex is not None, caps.regex),
            ("json_schema", opts.json_schema is not None, caps.json_schema),
            ("grammar", opts.grammar is not None, caps.grammar),
            ("tool_calls (a model family's call format)", opts.tool_calls is not None,
             caps.tool_calls),
            ("dtype (typed generation)", opts.value_type is not None, caps.value_type),
            ("return_logprob/top_logprobs_num", opts.logprobs is not None, caps.logprobs),
            ("stop_token_ids", bool(opts.stop_token_ids), caps.stop_token_ids),
            *((field, True, caps.extended_sampling) for field in extended_fields(opts)),
            ("priority", opts.priority is not None, caps.priority),
        ]
        for feature, requested, supported in wanted:
            if requested and not supported:
                raise UnsupportedFeatureError(
                    f"{name} cannot honour {feature}; remove it or use a backend that supports "
                    f"it (agentlang.Runtime or agentlang.RuntimeEndpoint)")
