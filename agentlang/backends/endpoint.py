"""``agentlang.RuntimeEndpoint``: a server speaking SGLang's native protocol (agentlang's own
``agentlang serve``, an SGLang server, or an SGLang cluster behind ``sglang-router``).

Routes used, all SGLang's: ``GET /get_model_info`` (model and tokenizer paths; the path SGLang's
own frontend reads, and the one sglang-router forwards: it answers 404 for ``/model_info``),
``POST /generate`` (plain, SSE streaming, ``max_new_tokens: 0`` prefills for the prefix cache and for the
logprobs of ``select``). Sampling options travel under SGLang's ``sampling_params`` names;
agentlang-only options travel only as optional top-level extensions, which SGLang's server
ignores (:data:`EXTENSIONS`): a Lark grammar (``lark_grammar``). Typed generation (``dtype``)
becomes SGLang's ``regex``; a JSON schema is sent as a JSON string, as SGLang expects.

The chat template comes from the model's tokenizer, loaded from the ``tokenizer_path`` the
server reports (a local directory or a Hugging Face id). ``cache_prefix`` prefills the text
into the server's radix cache, which keeps it until LRU eviction; SGLang's protocol has no
pinning, so ``release_prefix`` has nothing to release.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx

from agentlang.backends.base import Backend, Capabilities, GenDelta, GenResult, Prompt, run_session, session_of
from agentlang.chat_template import ChatTemplate, derive_chat_template
from agentlang.runtime.sampling.fields import to_sglang
from agentlang.sampling import SamplingOptions
from agentlang.runtime.core.typed_values import VALUE_TYPE_REGEX

EXTENSIONS = ("lark_grammar", "program", "agent")   # agentlang-only top-level /generate fields
# ``session_id`` (the program run's session) is SGLang's own top-level field (0.5.23).
# Engine fields that travel outside ``sampling_params`` (top level, or as a constraint below).
NOT_SAMPLING_PARAMS = ("json_schema", "regex", "grammar", "value_type", "priority", "agent",
                       "logprobs")


class EndpointError(RuntimeError):
    """The server answered with an error status (its message included)."""


class EndpointLimit(ValueError):
    """The server answered 429 (e.g. its limit of open sessions)."""


class RuntimeEndpoint(Backend):
    capabilities = Capabilities()

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600.0,
                 transport: httpx.BaseTransport | None = None, priority: int | None = None):
        """``priority``: the default of every run that sets none (higher first, unless the
        server was started with ``--schedule-low-priority-values-first``)."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL, got {url!r}")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.set_default_priority(priority)
        self.url = url.rstrip("/")
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s,
                                   transport=transport)
        self._template: ChatTemplate | None = None
        self._model_info: dict | None = None
        self._lock = threading.Lock()
        self._sessions: set[str] = set()        # sessions this client's runs sent
        self._hints = True                      # False: the server has no /session_hint

    @property
    def endpoint(self) -> RuntimeEndpoint:
        """SGLang's ``backend.endpoint`` (its ``Runtime`` wraps a ``RuntimeEndpoint``)."""
        return self

    # -- http ------------------------------------------------------------------------------
    def _post(self, path: str, payload: dict) -> Any:
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
        if r.status_code == 429:
            raise EndpointLimit(f"{r.request.url.path}: {detail}")
        if 400 <= r.status_code < 500:
            raise ValueError(f"{r.request.url.path}: {detail}")
        raise EndpointError(f"{r.request.url.path} failed with HTTP {r.status_code}: {detail}")

    def get_model_info(self) -> dict:
        with self._lock:
            if self._model_info is None:
                r = self.client.get("/get_model_info")
                self._raise_for(r)
                self._model_info = r.json()
            return self._model_info

    def get_model_name(self) -> str:
        """The served model's path, as SGLang's ``RuntimeEndpoint.get_model_name``."""
        return self.get_model_info()["model_path"]

    def get_server_info(self) -> dict:
        r = self.client.get("/server_info")
        self._raise_for(r)
        return r.json()

    def flush_cache(self) -> None:
        self._raise_for(self.client.post("/flush_cache"))

    # -- interface -------------------------------------------------------------------------
    def tool_format(self) -> str | None:
        """The served model's call format, from ``/model_info``: agentlang's ``tool_format``,
        else SGLang's ``tool_call_parser`` when it names a JSON format agentlang writes
        (Hermes, Mistral, Llama 3). FunctionGemma's syntax needs the runtime's own constraint:
        over HTTP its calls stay bare JSON objects (None)."""
        from agentlang.runtime.grammar.tool_format import FORMATS, format_of_parser

        info = self.get_model_info()
        fmt = info.get("tool_format") or format_of_parser(info.get("tool_call_parser"))
        return fmt if fmt in FORMATS and fmt != "agentlang" and not FORMATS[fmt].gemma else None

    def chat_template(self) -> ChatTemplate:
        info = self.get_model_info()
        with self._lock:
            if self._template is None:
                from transformers import AutoTokenizer

                path = info.get("tokenizer_path") or info["model_path"]
                tokenizer = AutoTokenizer.from_pretrained(path)

                def render(messages: list[dict], add_generation_prompt: bool) -> str:
                    return tokenizer.apply_chat_template(
                        messages, tokenize=False, add_generation_prompt=add_generation_prompt)

                self._template = derive_chat_template(render, name=path)
            return self._template

    def generate(self, prompt: Prompt, opts: SamplingOptions) -> GenResult:
        body = self.payload(prompt.text, opts, False, prompt.tag)
        try:
            return self._result(self._post("/generate", body))
        except EndpointLimit:
            if body.pop("session_id", None) is None:
                raise
            return self._result(self._post("/generate", body))   # no session: plain LRU

    def end_run(self, run_id: str) -> None:
        """Close the run's session (best effort: a server without it answers 404, SGLang's
        200; neither is an error of the program)."""
        sid = run_session(run_id)
        with self._lock:
            if sid not in self._sessions:
                return                    # the run generated nothing: no session to close
            self._sessions.discard(sid)
        try:
            self.client.post("/close_session", json={"session_id": sid})
        except httpx.HTTPError:
            pass

    def next_use(self, run_id: str, seconds: float) -> None:
        """``POST /session_hint`` for the run's session (agentlang's route; a server without
        it, e.g. SGLang's, answers 404 once and is not asked again)."""
        sid = run_session(run_id)
        with self._lock:
            if sid not in self._sessions or not self._hints:
                return
        try:
            r = self.client.post("/session_hint", json={"session_id": sid, "next_use_s": seconds})
        except httpx.HTTPError:
            return
        if r.status_code in (404, 405) and "session_id" not in r.text:
            with self._lock:
                self._hints = False       # no such route (an unknown session names session_id)

    def stream(self, prompt: Prompt, opts: SamplingOptions) -> Iterator[GenDelta]:
        body = self.payload(prompt.text, opts, True, prompt.tag)
        try:
            yield from self._stream(body)
        except EndpointLimit:
            if body.pop("session_id", None) is None:
                raise
            yield from self._stream(body)

    def _stream(self, body: dict) -> Iterator[GenDelta]:
        seen = 0
        with self.client.stream("POST", "/generate", json=body) as r:
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
        """Logprobs of each continuation's tokens after ``prefix``, from prefill-only
        ``/generate`` calls, one per prompt (``prefix``, then every ``prefix + continuation``;
        one prompt per call because sglang-router forwards no batched ``text``; the prefix is
        in the radix cache after the first), with input logprobs from position 0. A continuation's tokens start where its token ids first differ from
        the prefix's, so a token that merges the prefix's end with the continuation's start
        (``"is " + "blue"`` → ``" blue"``) is scored whole. The first token of a prompt has no
        logprob (``None``), as in SGLang."""
        texts = ([prefix] if prefix else []) + [prefix + c for c in continuations]
        resp = [self._post("/generate", {
            "text": text, "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 0}) for text in texts]
        rows = [[(e[0], e[1]) for e in r["meta_info"]["input_token_logprobs"]] for r in resp]
        if not prefix:
            return [[lp for lp, _ in row] for row in rows]
        base = [tid for _, tid in rows[0]]
        out = []
        for row in rows[1:]:
            k = 0
            while k < min(len(base), len(row)) and base[k] == row[k][1]:
                k += 1
            k = min(max(k, 1), len(row) - 1)
            out.append([lp for lp, _ in row[k:]])
        return out

    def cache_prefix(self, text: str) -> Any:
        """Prefills ``text`` into the server's radix cache (kept until LRU eviction)."""
        self._post("/generate", {"text": text, "sampling_params": {"max_new_tokens": 0}})
        return None

    def release_prefix(self, handle: Any) -> None:
        """Nothing is pinned over SGLang's protocol, so nothing is released."""

    def close(self) -> None:
        self.client.close()

    # -- mapping ---------------------------------------------------------------------------
    def payload(self, text: str, opts: SamplingOptions, stream: bool,
                tag: dict | None = None) -> dict:
        """The ``/generate`` body. ``tag`` (the program / branch asking) travels as the optional
        top-level ``program`` field, never inside ``sampling_params``."""
        schema = opts.json_schema_dict()
        regex = opts.regex if opts.value_type is None else VALUE_TYPE_REGEX[opts.value_type]
        params = {to_sglang(k): v for k, v in opts.engine_fields().items()
                  if k not in NOT_SAMPLING_PARAMS}
        if schema is not None:
            params["json_schema"] = json.dumps(schema)
        if regex is not None:
            params["regex"] = regex
        body: dict[str, Any] = {"text": text, "stream": stream, "sampling_params": params}
        if opts.grammar is not None:
            body["lark_grammar"] = opts.grammar
        for name, value in (("priority", self.priority_of(opts)), ("agent", opts.agent)):
            if value is not None:
                body[name] = value
        if opts.logprobs is not None:
            body["return_logprob"] = True
            body["top_logprobs_num"] = opts.logprobs
            body["return_text_in_logprobs"] = True
        if tag is not None:
            body["program"] = tag
            sid = session_of(tag)
            if sid is not None:
                body["session_id"] = sid
                with self._lock:
                    self._sessions.add(sid)
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
