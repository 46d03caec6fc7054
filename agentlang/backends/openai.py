"""``agentlang.OpenAI``: any OpenAI-compatible server through the official ``openai`` client.

``api="chat"`` (default) sends the program's finished messages to ``/chat/completions``; a
``gen`` must then open an assistant turn (the chat API cannot continue partial text).
``api="completions"`` sends the rendered text to ``/completions``. Features such a server
cannot honour raise ``UnsupportedFeatureError``: regex, grammar, typed gens, stop token ids,
top_k/min_p/min_tokens/ignore_eos/repetition_penalty, prefix caching, and ``select`` unless
the server returns prompt logprobs (completions API with ``echo=True``). ``json_schema``
becomes ``response_format`` (chat API only).

``extended_sampling=True`` says the server takes the sampling fields vLLM and SGLang add to
both APIs (``top_k``, ``min_p``, ``min_tokens``, ``ignore_eos``, ``repetition_penalty``):
they are then sent as extra body fields instead of raising (what a fixed-length benchmark
needs: ``ignore_eos``). The official OpenAI service rejects them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from agentlang.backends.base import (Backend, Capabilities, GenDelta, GenResult, Prompt,
                                     UnsupportedFeatureError, extended_fields)
from agentlang.chat_template import ChatTemplate, chatml
from agentlang.sampling import SamplingOptions


class OpenAI(Backend):
    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, *,
                 api: str = "chat", chat_template: ChatTemplate | None = None,
                 client: Any = None, extended_sampling: bool = False):
        if api not in ("chat", "completions"):
            raise ValueError(f"api must be 'chat' or 'completions', got {api!r}")
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty model name")
        import openai

        self.model = model
        self.api = api
        self.client = client if client is not None else openai.OpenAI(
            base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY")
        chat = api == "chat"
        self.capabilities = Capabilities(
            regex=False, json_schema=chat, grammar=False, value_type=False, logprobs=True,
            score=not chat, prefix_cache=False, stream=True, stop_token_ids=False,
            extended_sampling=bool(extended_sampling), text_prompt=not chat, priority=False)
        template = chat_template or chatml()
        self._template = dataclasses.replace(template, stop_str=()) if chat else template

    def chat_template(self) -> ChatTemplate:
        return self._template

    # -- generation ------------------------------------------------------------------------
    def _request(self, prompt: Prompt, opts: SamplingOptions) -> dict:
        self.check(opts)
        args: dict[str, Any] = {"model": self.model, "max_tokens": opts.max_tokens,
                                "temperature": opts.temperature, "top_p": opts.top_p}
        for name in ("frequency_penalty", "presence_penalty", "seed"):
            if getattr(opts, name) not in (None, 0.0):
                args[name] = getattr(opts, name)
        if opts.stop:
            args["stop"] = list(opts.stop)
        extra = extended_fields(opts)
        if extra:                                   # check() let them through: the server takes them
            args["extra_body"] = extra
        if self.api == "completions":
            args["prompt"] = prompt.text
            if opts.logprobs is not None:
                args["logprobs"] = opts.logprobs or 1
            return args
        if prompt.open_role != "assistant" or prompt.open_text:
            raise UnsupportedFeatureError(
                "the OpenAI chat API can only generate a whole assistant message: put gen() "
                "right after assistant_begin() / inside s.assistant(...) with nothing before it "
                "(or use OpenAI(..., api='completions'))")
        args["messages"] = list(prompt.messages)
        if opts.logprobs is not None:
            args["logprobs"] = True
            args["top_logprobs"] = opts.logprobs
        schema = opts.json_schema_dict()
        if schema is not None:
            args["response_format"] = {"type": "json_schema", "json_schema": {
                "name": schema.get("title", "output"), "schema": schema}}
        return args

    def generate(self, prompt: Prompt, opts: SamplingOptions) -> GenResult:
        args = self._request(prompt, opts)
        if self.api == "completions":
            resp = self.client.completions.create(**args)
            choice = resp.choices[0]
            text = choice.text
            logprobs = None
            if opts.logprobs is not None and choice.logprobs is not None:
                lp = choice.logprobs
                logprobs = [(v, -1, sorted(((-1, p) for p in (top or {}).values()),
                                           key=lambda t: -t[1]))
                            for v, top in zip(lp.token_logprobs, lp.top_logprobs or
                                              [None] * len(lp.token_logprobs))]
        else:
            resp = self.client.chat.completions.create(**args)
            choice = resp.choices[0]
            text = choice.message.content or ""
            logprobs = None
            if opts.logprobs is not None and choice.logprobs is not None:
                logprobs = [(t.logprob, -1, [(-1, a.logprob) for a in t.top_logprobs or []])
                            for t in choice.logprobs.content or []]
        return GenResult(text, "length" if choice.finish_reason == "length" else "stop", None,
                         self._meta(resp), logprobs)

    def stream(self, prompt: Prompt, opts: SamplingOptions) -> Iterator[GenDelta]:
        args = self._request(prompt, opts)
        text, finish = "", "stop"
        create = (self.client.completions.create if self.api == "completions"
                  else self.client.chat.completions.create)
        for chunk in create(**args, stream=True):
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            piece = choice.text if self.api == "completions" else (choice.delta.content or "")
            if piece:
                text += piece
                yield GenDelta(piece)
            if choice.finish_reason:
                finish = "length" if choice.finish_reason == "length" else "stop"
        yield GenDelta("", GenResult(text, finish, None, {}, None))

    @staticmethod
    def _meta(resp: Any) -> dict:
        usage = getattr(resp, "usage", None)
        if usage is None:
            return {}
        details = getattr(usage, "prompt_tokens_details", None)
        return {"prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "cached_tokens": getattr(details, "cached_tokens", 0) or 0}

    # -- select ----------------------------------------------------------------------------
    def score(self, prefix: str, continuations: list[str]) -> list[list[float]]:
        if self.api == "chat":
            raise UnsupportedFeatureError(
                "select() needs prompt log-probabilities, which the OpenAI chat API does not "
                "return; use OpenAI(..., api='completions') against a server that supports "
                "echo=True with logprobs, or agentlang.Runtime / RuntimeEndpoint")
        out = []
        for cont in continuations:
            resp = self.client.completions.create(model=self.model, prompt=prefix + cont,
                                                  max_tokens=1, echo=True, logprobs=1,
                                                  temperature=0.0)
            lp = resp.choices[0].logprobs
            if lp is None or not lp.token_logprobs or not lp.text_offset:
                raise UnsupportedFeatureError(
                    f"the server did not return prompt logprobs for echo=True (needed by "
                    f"select()); it cannot score choices")
            out.append([v if v is not None else 0.0
                        for v, off in zip(lp.token_logprobs, lp.text_offset)
                        if len(prefix) <= off < len(prefix) + len(cont)])
        return out
