"""Prompt normalization: text, token ids, chat messages, or lists of them → token id lists."""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

from agentlang.runtime.request.limits import RequestLimits

PromptInput = Union[str, list[int], list[str], list[list[int]], list[dict]]


def _is_ids(x: object) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def _is_chat(x: object) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(m, dict) for m in x)


def validate_messages(messages: list[dict], field: str = "messages") -> None:
    roles = ("system", "user", "assistant", "tool")
    for i, m in enumerate(messages):
        if m.get("role") not in roles:
            raise ValueError(f"{field}[{i}].role: must be one of {roles}, got {m.get('role')!r}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"{field}[{i}].content: must be a string")


def normalize_prompts(prompts: object, tokenizer, limits: RequestLimits, field: str = "prompt",
                      single_only: bool = False,
                      chat: Callable[[list[dict]], str] | None = None) -> tuple[bool, list[list[int]]]:
    """Returns (was_single, token id lists). Raises ValueError naming ``field`` (token ids
    checked by ``limits``)."""
    def encode(p: object, name: str) -> list[int]:
        if isinstance(p, str):
            if not p:
                raise ValueError(f"{name}: must be a non-empty string")
            ids = tokenizer.encode(p)
        elif _is_ids(p):
            ids = limits.check_ids(p, name)
        elif _is_chat(p) and chat is not None:
            validate_messages(p, name)
            ids = tokenizer.encode(chat(p), add_special_tokens=False)
        else:
            raise ValueError(
                f"{name}: expected a non-empty string, a list of token ids or a list of chat "
                f"messages, got {type(p).__name__}{' (empty)' if p == [] else ''}"
            )
        if not ids:
            raise ValueError(f"{name}: tokenizes to zero tokens")
        return ids

    if isinstance(prompts, str) or _is_ids(prompts) or _is_chat(prompts):
        return True, [encode(prompts, field)]
    if single_only:
        raise ValueError(f"{field}: expected one prompt, got {type(prompts).__name__}")
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"{field}: expected a prompt or a non-empty list of prompts")
    return False, [encode(p, f"{field}[{i}]") for i, p in enumerate(prompts)]
