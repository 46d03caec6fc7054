"""Per-app server state: the engine, names it answers to, pinned prefixes, metrics, and the
request preparation every endpoint shares (prompt encoding, token limits, sampling parameters,
constraint compilation). One instance per app; nothing lives at module level."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from agentlang.runtime.chat.family import ChatFamily, ChatTemplateError
from agentlang.runtime.engine.engine import Engine, PrefixHandle
from agentlang.runtime.sampling.params import SamplingParams
from agentlang.runtime.core.errors import EngineValueError
from agentlang.runtime.server.errors import APIError, bad_request, engine_error, from_value_error
from agentlang.runtime.server.logprobs import TokenTexts
from agentlang.runtime.server.ops.metrics import ServerMetrics


@dataclass(eq=False)
class ServerState:
    engine: Engine
    api_key: str | None = None
    served_model_name: str | None = None
    metrics: ServerMetrics = field(init=False)
    tokens: TokenTexts = field(init=False)
    family: ChatFamily = field(init=False)      # the model's tool-call and reasoning format
    created: int = field(default_factory=lambda: int(time.time()))
    prefixes: dict[str, PrefixHandle] = field(default_factory=dict)
    native_rids: set[str] = field(default_factory=set)   # running /generate rids (abort)
    _handle_ids: Any = field(default_factory=lambda: itertools.count(1))
    _grammar_lock: asyncio.Lock | None = None

    def __post_init__(self) -> None:
        self.served_model_name = self.served_model_name or self.engine.model_name
        self.metrics = ServerMetrics(self.engine)
        self.tokens = TokenTexts(self.engine.tokenizer)
        self.family = ChatFamily.of(self.engine.tokenizer)   # ChatFamilyError: not served

    # ---- names and limits ---------------------------------------------------------------
    @property
    def model_aliases(self) -> set[str]:
        e = self.engine
        return {self.served_model_name, e.model_name, str(e.model_path), "default"}

    def check_model(self, name: str | None) -> None:
        if name is None:
            return
        if name not in self.model_aliases:
            raise APIError(400, f"model: {name!r} is not served here; this server serves "
                           f"{self.served_model_name!r}", "model", "model_not_found")

    @property
    def token_limit(self) -> int:
        """Most tokens (prompt + output) one sequence may hold (the engine's limits)."""
        return self.engine.limits.token_limit

    def max_tokens_for(self, prompt_len: int, requested: int | None, param: str,
                       prompt_param: str) -> int:
        """The engine's own check (:meth:`RequestLimits.output_budget`) as a 400
        ``context_length_exceeded``; ``None`` means "up to the limit"."""
        try:
            return self.engine.limits.output_budget(prompt_len, requested, param, prompt_param)
        except EngineValueError as e:
            raise engine_error(e.error) from None

    # ---- prompts ------------------------------------------------------------------------
    def encode_text(self, text: str, param: str) -> list[int]:
        if not isinstance(text, str) or not text:
            raise bad_request(f"{param}: must be a non-empty string", param)
        return self.engine.tokenizer.encode(text)

    def check_ids(self, ids: Any, param: str) -> list[int]:
        """The engine's check of token ids (:meth:`RequestLimits.check_ids`) as a 400."""
        try:
            return self.engine.limits.check_ids(ids, param)
        except ValueError as e:
            raise from_value_error(e) from None

    def chat_ids(self, messages: list[dict], add_generation_prompt: bool = True,
                 **template_kwargs: Any) -> list[int]:
        """``messages`` rendered by the model's template (``template_kwargs``: ``tools``,
        ``chat_template_kwargs``) and encoded; a template that fails is a 400 on ``messages``."""
        try:
            text = self.engine.apply_chat_template(messages, add_generation_prompt, **template_kwargs)
        except ChatTemplateError as e:
            raise bad_request(f"messages: {e}", "messages") from None
        return self.engine.tokenizer.encode(text, add_special_tokens=False)

    # ---- sampling parameters ------------------------------------------------------------
    def sampling_params(self, fields: dict[str, Any], param_map: dict[str, str] | None = None,
                        default_param: str | None = None) -> SamplingParams:
        """``SamplingParams(**fields)`` (``None`` values dropped); errors → 400 naming the
        request field (``param_map`` renames engine names to request names)."""
        try:
            return SamplingParams(**{k: v for k, v in fields.items() if v is not None})
        except ValueError as e:
            raise from_value_error(e, param_map, default_param) from None

    async def compile_constraint(self, params: SamplingParams, param: str | None,
                                 prefix: str = "", budget_param: str = "max_tokens") -> None:
        """Validate and compile ``params``' constraint before the request is accepted (through
        the engine's one owner, :meth:`Engine.compile_constraint`), so a bad schema / regex /
        grammar, an unsatisfiable one, or a budget below its shortest valid output is a 400
        (not a failed stream), and the engine's submit finds all of it done (the normalised
        constraint on ``params``, the compiled grammar and its minimum cached). Compilation
        runs off the event loop. Errors name ``param``, or
        ``prefix + <engine field>`` when ``param`` is None; the budget error names
        ``budget_param``."""
        if not params.has_constraint:
            return
        from agentlang.runtime.grammar.budget import BudgetTooSmall
        from agentlang.runtime.grammar.constraints import CONSTRAINT_FIELDS

        try:
            if self._grammar_lock is None:
                self._grammar_lock = asyncio.Lock()
            async with self._grammar_lock:       # the first call builds the backend's vocab
                await asyncio.to_thread(self.engine.grammar_cache)
            grammar = await asyncio.to_thread(self.engine.compile_constraint, params,
                                              budget_param)
            await asyncio.wrap_future(grammar)   # a constraint the backend does not support
        except BudgetTooSmall as e:             # its message names budget_param already
            raise bad_request(str(e), budget_param, code="budget_too_small") from None
        except ValueError as e:
            renames = {k: param or prefix + k for k in CONSTRAINT_FIELDS + ("json_indent",)}
            err = from_value_error(e, renames, param)
            err.code = "invalid_constraint"
            raise err from None

    # ---- pinned prefixes ----------------------------------------------------------------
    def add_prefix(self, handle: PrefixHandle) -> str:
        hid = f"prefix-{next(self._handle_ids)}"
        self.prefixes[hid] = handle
        return hid

    def pop_prefix(self, hid: Any) -> PrefixHandle:
        if not isinstance(hid, str) or hid not in self.prefixes:
            raise bad_request(f"handle: unknown or already released prefix handle {hid!r}",
                              "handle")
        return self.prefixes.pop(hid)

    def release_all_prefixes(self) -> None:
        for hid in list(self.prefixes):
            self.engine.release_prefix(self.prefixes.pop(hid))
