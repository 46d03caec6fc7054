"""``agentlang.Runtime``: the in-process engine (``runtime.Engine``) as a backend.

The engine's background loop is started at construction, so generations submitted from many
program threads at once (forks, ``run_batch``, ``arun``) are batched together. ``select``
scores choices with ``Engine.score`` (the prompt is prefilled once and shared); forks and
batches pin shared prefixes with ``Engine.cache_prefix`` / ``release_prefix``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from agentlang.backends.base import Backend, Capabilities, GenDelta, GenResult, Prompt, run_session, session_of
from agentlang.chat_template import ChatTemplate, derive_chat_template
from agentlang.sampling import SamplingOptions


def engine_option_names() -> list[str]:
    from agentlang.runtime.engine.config import EngineConfig

    return sorted(f.name for f in dataclasses.fields(EngineConfig) if f.name != "model")


class Runtime(Backend):
    capabilities = Capabilities(tool_calls=True)

    def __init__(self, model: str = "default", *, priority: int | None = None,
                 **engine_args: Any):
        """``priority``: the default of every run that sets none (higher first).
        ``engine_args`` are :class:`~agentlang.runtime.engine.config.EngineConfig` options; ``weights``
        defaults to ``"auto"`` here (a GGUF, the embedded model included, runs on its quantized
        tensors), where the bare engine's default is the exact ``"dense"``."""
        if "model_path" in engine_args:  # SGLang's name for the model
            if model != "default":
                raise ValueError("give model or model_path, not both")
            model = engine_args.pop("model_path")
        accepted = engine_option_names()
        unknown = sorted(set(engine_args) - set(accepted))
        if unknown:
            raise ValueError(f"unknown Runtime option(s) {unknown}; accepted: "
                             f"{', '.join(accepted)}")
        self.set_default_priority(priority)
        engine_args.setdefault("weights", "auto")
        from agentlang.runtime import Engine

        self.engine = Engine(model=model, **engine_args)
        self.engine.start_background_loop()
        self._tool_format: tuple[str] | None = None
        self._template = derive_chat_template(
            lambda messages, gen: self.engine.apply_chat_template(messages, gen),
            name=self.engine.model_name)

    @property
    def endpoint(self) -> Runtime:
        """SGLang's ``Runtime.endpoint``: here the backend itself (``get_model_name``)."""
        return self

    def get_model_name(self) -> str:
        """The model's path, as SGLang's ``RuntimeEndpoint.get_model_name`` (the server's
        ``model_path``: an HF-style directory, for a GGUF the one holding its config and
        tokenizer)."""
        return str(self.engine.hf_dir)

    # -- interface ---------------------------------------------------------------------
    def chat_template(self) -> ChatTemplate:
        return self._template

    def tool_format(self) -> str | None:
        """The model's family format when its template renders tools (Qwen's Hermes
        ``<tool_call>``, Mistral's, Llama 3's JSON); ``ChatFamilyError`` names a marker the
        vocabulary lacks."""
        if self._tool_format is None:                # read once, on the first tool call
            from agentlang.runtime.chat.family import ChatFamily

            family = ChatFamily.of(self.engine.tokenizer)
            self._tool_format = (family.tool_format if family.native_tools else "",)
        return self._tool_format[0] or None

    def generate(self, prompt: Prompt, opts: SamplingOptions) -> GenResult:
        out = self.engine.generate(prompt.text, self._params(prompt, opts))
        return self._result(out)

    def stream(self, prompt: Prompt, opts: SamplingOptions) -> Iterator[GenDelta]:
        for d in self.engine.generate_stream(prompt.text, self._params(prompt, opts)):
            yield GenDelta(d.text, self._result(d.output) if d.output is not None else None)

    def end_run(self, run_id: str) -> None:
        self.engine.sessions.close(run_session(run_id))

    def next_use(self, run_id: str, seconds: float) -> None:
        from agentlang.runtime.session.session import SessionError

        try:
            self.engine.sessions.hint(run_session(run_id), seconds)
        except SessionError:
            pass                          # the run has no session (the engine's limit)

    def _params(self, prompt: Prompt, opts: SamplingOptions) -> Any:
        """The engine's parameters in the run's session; without one when the engine's
        session limit is reached (the run then uses the plain LRU cache, never refused)."""
        from agentlang.runtime.session.session import SessionError

        session = session_of(prompt.tag)
        if session is not None:
            try:
                self.engine.sessions.ensure(session)
            except SessionError as e:
                if e.status != 429:
                    raise
                session = None
        return self.sampling_params(opts, session)

    def score(self, prefix: str, continuations: list[str]) -> list[list[float]]:
        if prefix:
            return self.engine.score(prefix, continuations)
        # Unconditional: each continuation alone; its first token has no context (None).
        from agentlang.runtime import SamplingParams

        outs = self.engine.generate(list(continuations),
                                    SamplingParams(max_tokens=1, prompt_logprobs=0))
        return [list(o.prompt_logprobs or []) for o in outs]

    def cache_prefix(self, text: str) -> Any:
        return self.engine.cache_prefix(text)

    def release_prefix(self, handle: Any) -> None:
        self.engine.release_prefix(handle)

    def metrics(self) -> dict:
        return self.engine.metrics()

    def close(self) -> None:
        self.engine.shutdown()

    shutdown = close  # SGLang's name

    # -- mapping -----------------------------------------------------------------------
    def sampling_params(self, opts: SamplingOptions, session: str | None = None) -> Any:
        from agentlang.runtime import SamplingParams

        fields = opts.engine_fields()
        if session is not None:
            fields["session"] = session
        priority = self.priority_of(opts)
        if priority is not None:
            fields["priority"] = priority
        return SamplingParams(**fields)

    @staticmethod
    def _result(out: Any) -> GenResult:
        if getattr(out, "error", None):
            raise RuntimeError(f"the engine failed this generation: {out.error}")
        first = out.outputs[0]
        logprobs = None
        if first.logprobs is not None:
            logprobs = [(t.logprob, t.token_id, list(t.top)) for t in first.logprobs]
        # forced_completion_tokens: tokens the budget guard chose to keep the output valid
        return GenResult(first.text, first.finish_reason or "stop", first.matched_stop,
                         dict(out.meta, forced_completion_tokens=first.forced_completion_tokens),
                         logprobs)
