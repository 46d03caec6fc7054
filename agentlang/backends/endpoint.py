"""``agentlang.RuntimeEndpoint``: our server's native HTTP API as a backend.

Endpoints used: ``POST /generate`` (plain and SSE streaming), ``POST /score``,
``POST /cache_prefix`` / ``POST /release_prefix``, ``POST /apply_chat_template``,
``GET /get_model_info``. Sampling options travel under the engine's field names.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx

from agentlang.backends.base import Backend, Capabilities, GenDelta, GenResult, Prompt
from agentlang.chat_template import ChatTemplate, derive_chat_template
from agentlang.sampling import SamplingOptions


class EndpointError(RuntimeError):
    """The server answered with an error status (its message included)."""


class RuntimeEndpoint(Backend):
    capabilities = Capabilities()

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600.0,
                 transport: httpx.BaseTransport | None = None):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL, got {url!r}")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s,
                                   transport=transport)
        self._template: ChatTemplate | None = None
        self._lock = threading.Lock()

    # -- http ------------------------------------------------------------------------------
    def _post(self, path: str, payload: dict) -> dict:
        r = self.client.post(path, json=payload)
        self._raise_for(r)
        return r.json()

    @staticmethod
    def _raise_for(r: httpx.Response) -> None:
        if r.status_code < 400:
            return
        r.read()
        try:
            detail = r.json()
            detail = detail.get("detail") or detail.get("error") or detail
            if isinstance(detail, dict) and "message" in detail:
                detail = detail["message"]
        except ValueError:
            detail = r.text
        if 400 <= r.status_code < 500:
            raise ValueError(f"{r.request.url.path}: {detail}")
        raise EndpointError(f"{r.request.url.path} failed with HTTP {r.status_code}: {detail}")

    def get_model_info(self) -> dict:
        r = self.client.get("/get_model_info")
        self._raise_for(r)
        return r.json()

    # -- interface -------------------------------------------------------------------------
    def chat_template(self) -> ChatTemplate:
        with self._lock:
            if self._template is None:
                def render(messages: list[dict], add_generation_prompt: bool) -> str:
                    return self._post("/apply_chat_template", {
                        "messages": messages,
                        "add_generation_prompt": add_generation_prompt})["text"]

                self._template = derive_chat_template(render, name=self.url)
            return self._template

    def generate(self, prompt: Prompt, opts: SamplingOptions) -> GenResult:
        return self._result(self._post("/generate", self.payload(prompt.text, opts, False)))

    def stream(self, prompt: Prompt, opts: SamplingOptions) -> Iterator[GenDelta]:
        seen = 0
        with self.client.stream("POST", "/generate",
                                json=self.payload(prompt.text, opts, True)) as r:
            self._raise_for(r)
            last = None
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                last = json.loads(data)
                if "error" in last:
                    raise EndpointError(f"/generate stream: {last['error']}")
                text = last.get("text", "")
                if len(text) > seen:
                    yield GenDelta(text[seen:])
                    seen = len(text)
            if last is None:
                raise EndpointError("/generate stream ended without any data")
            yield GenDelta("", self._result(last))

    def score(self, prefix: str, continuations: list[str]) -> list[list[float]]:
        if prefix:
            return self._post("/score", {"prefix": prefix,
                                         "continuations": list(continuations)})["logprobs"]
        out = []  # unconditional: each continuation alone, logprobs of its own tokens
        for cont in continuations:
            resp = self._post("/generate", {
                "text": cont, "sampling_params": {"max_tokens": 1, "temperature": 0.0},
                "return_logprob": True, "logprob_start_len": 0})
            out.append([lp for lp, *_ in resp["meta_info"]["input_token_logprobs"]])
        return out

    def cache_prefix(self, text: str) -> Any:
        return self._post("/cache_prefix", {"text": text})["handle"]

    def release_prefix(self, handle: Any) -> None:
        self._post("/release_prefix", {"handle": handle})

    def close(self) -> None:
        self.client.close()

    # -- mapping ---------------------------------------------------------------------------
    @staticmethod
    def payload(text: str, opts: SamplingOptions, stream: bool) -> dict:
        params = {
            "max_tokens": opts.max_tokens, "min_tokens": opts.min_tokens,
            "temperature": opts.temperature, "top_p": opts.top_p, "top_k": opts.top_k,
            "min_p": opts.min_p, "repetition_penalty": opts.repetition_penalty,
            "frequency_penalty": opts.frequency_penalty,
            "presence_penalty": opts.presence_penalty, "seed": opts.seed,
            "stop": list(opts.stop) if opts.stop else None,
            "stop_token_ids": list(opts.stop_token_ids) if opts.stop_token_ids else None,
            "ignore_eos": opts.ignore_eos, "json_schema": opts.json_schema_dict(),
            "regex": opts.regex, "grammar": opts.grammar, "value_type": opts.value_type}
        body: dict[str, Any] = {"text": text, "stream": stream,
                                "sampling_params": {k: v for k, v in params.items()
                                                    if v is not None}}
        if opts.logprobs is not None:
            body["return_logprob"] = True
            body["top_logprobs_num"] = opts.logprobs
        return body

    @staticmethod
    def _result(resp: dict) -> GenResult:
        meta = dict(resp.get("meta_info", {}))
        finish = meta.pop("finish_reason", None) or {}
        if isinstance(finish, str):
            finish = {"type": finish}
        logprobs = None
        if meta.get("output_token_logprobs") is not None:
            tops = meta.get("output_top_logprobs") or []
            logprobs = []
            for i, (lp, tid, *_) in enumerate(meta["output_token_logprobs"]):
                top = [(t[1], t[0]) for t in tops[i]] if i < len(tops) and tops[i] else []
                logprobs.append((lp, tid, top))
        return GenResult(resp.get("text", ""), finish.get("type", "stop"), finish.get("matched"),
                         meta, logprobs)
