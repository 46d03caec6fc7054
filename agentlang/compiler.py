"""Batch planning: which prefixes to cache before a ``run_batch`` and in which order to run it.

Each program of the batch is traced with its concrete arguments up to its first generation
(``tracer.trace_program(..., stop_at_first_generation=True)``), which gives the exact text it
will send first. Sorting the batch by that text puts programs that share prefixes next to each
other; each run of adjacent programs sharing at least ``min_shared_chars`` characters gets its
common prefix cached (prefilled once and locked) before the batch starts. Fork points inside a
program are handled at run time by the executor (executor.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from agentlang.chat_template import ChatTemplate
from agentlang.tracer import trace_program

MIN_SHARED_CHARS = 64


@dataclass(frozen=True)
class BatchPlan:
    order: list[int]           # indices into the batch, in submission order
    prefixes: list[str]        # shared prefixes to cache first
    keys: list[str]            # each program's text before its first generation


def common_prefix(a: str, b: str) -> str:
    return os.path.commonprefix([a, b])


def token_safe(prefix: str, whole: list[str]) -> str:
    """Cut a shared prefix before its last whitespace so the cut does not split a token
    that the full prompts would merge with the next word (unless a prompt ends there)."""
    if any(k == prefix for k in whole):
        return prefix
    cut = max(prefix.rfind(" "), prefix.rfind("\n"), prefix.rfind("\t"))
    return prefix[:cut] if cut > 0 else prefix


def prompt_key(program: Any, template: ChatTemplate, arguments: dict[str, Any]) -> str:
    graph = trace_program(program, template, arguments, strict=False,
                          stop_at_first_generation=True)
    return graph.prompt_prefix


def plan_batch(program: Any, template: ChatTemplate, batch: list[dict[str, Any]],
               min_shared_chars: int = MIN_SHARED_CHARS) -> BatchPlan:
    keys = [prompt_key(program, template, args) for args in batch]
    order = sorted(range(len(batch)), key=lambda i: keys[i])
    prefixes: list[str] = []
    group: list[str] = []
    shared = ""

    def close() -> None:
        if len(group) > 1 and len(shared) >= min_shared_chars:
            prefix = token_safe(shared, group)
            if len(prefix) >= min_shared_chars:
                prefixes.append(prefix)

    for i in order:
        key = keys[i]
        if group and len(common_prefix(shared, key)) >= min_shared_chars:
            shared = common_prefix(shared, key)
            group.append(key)
            continue
        close()
        group, shared = [key], key
    close()
    return BatchPlan(order, prefixes, keys)
