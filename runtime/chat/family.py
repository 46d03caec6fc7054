"""The chat family of a tokenizer: which tool-call format its chat template writes, whether the
template renders tools itself, and whether its model thinks in ``<think>`` blocks.

Detection reads the template text (HF's ``tokenizer.chat_template``; a GGUF's
``tokenizer.chat_template`` arrives there through transformers): a template that uses
``tools`` and writes ``<tool_call>`` is Hermes-style (Qwen2.5, Qwen3), ``[TOOL_CALLS]`` is
Mistral's, ``<start_function_call>`` FunctionGemma's (Gemma 3's function-calling model; plain
Gemma 2 / 3 templates have no tools), a JSON prompt with ``"parameters"`` is Llama 3.1+'s; any other template (or none)
keeps agentlang's own tools prompt (``agentlang`` format, tools described in the system
message). A format whose marker is a token of that family (``<tool_call>``, ``[TOOL_CALLS]``)
must find it in the vocabulary as one token, or :class:`ChatFamilyError` says so at load: a
model that cannot emit its own marker would never call a tool.

:func:`render` is ``apply_chat_template`` with the template's own keywords (``tools``,
``enable_thinking``, ...); a template that fails raises :class:`ChatTemplateError` naming the
template's complaint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentlang.runtime.grammar.tool_format import FORMATS, REASONING
from agentlang.runtime.weights.model_loader import ModelLoadError

MARKERS = {"hermes": ("<tool_call>", "</tool_call>"), "mistral": ("[TOOL_CALLS]",),
           "functiongemma": ("<start_function_call>", "<end_function_call>", "<escape>")}


class ChatFamilyError(ModelLoadError):
    """The chat template's tool-call convention cannot work with this vocabulary."""


class ChatTemplateError(ValueError):
    """The model's chat template raised while rendering; the message holds its reason."""


@dataclass(frozen=True)
class ChatFamily:
    tool_format: str = "agentlang"     # a key of grammar.tool_format.FORMATS
    native_tools: bool = False         # the template renders `tools` (else agentlang's prompt)
    reasoning: str | None = None       # "think": the model opens answers with a <think> block

    @classmethod
    def of(cls, tokenizer: Any) -> "ChatFamily":
        template = tokenizer.chat_template
        if isinstance(template, dict):                 # named templates: the default one
            template = template.get("default") or next(iter(template.values()), None)
        t = template or ""
        reasoning = "think" if "<think>" in t and "</think>" in t else None
        fmt = "agentlang"
        if "tools" in t:
            if "<start_function_call>" in t:
                fmt = "functiongemma"
            elif "<tool_call>" in t:
                fmt = "hermes"
            elif "[TOOL_CALLS]" in t:
                fmt = "mistral"
            elif '"parameters"' in t or "parameters" in t and "<|eot_id|>" in t:
                fmt = "llama3_json"
        for marker in MARKERS.get(fmt, ()):
            if not _single_token(tokenizer, marker):
                raise ChatFamilyError(
                    f"the chat template writes tool calls in the {fmt} format with {marker!r}, "
                    f"but {marker!r} is not a token of the vocabulary (it encodes as "
                    f"{tokenizer.encode(marker, add_special_tokens=False)})")
        assert fmt in FORMATS and (reasoning is None or reasoning in REASONING)
        return cls(fmt, fmt != "agentlang", reasoning)

    def thinking(self, template_kwargs: dict | None) -> bool:
        """Whether a request's answer opens with a reasoning block (``enable_thinking`` in
        ``chat_template_kwargs``, Qwen3's switch, defaults to on)."""
        return self.reasoning is not None and (template_kwargs or {}).get("enable_thinking", True) is not False


def _single_token(tokenizer: Any, marker: str) -> bool:
    return len(tokenizer.encode(marker, add_special_tokens=False)) == 1


def render(tokenizer: Any, messages: list[dict], add_generation_prompt: bool = True,
           **template_kwargs: Any) -> str:
    """``messages`` through the tokenizer's chat template (``tools=...`` etc. passed on)."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=add_generation_prompt,
                                             **template_kwargs)
    except Exception as e:   # jinja2 raises its own types (TemplateError, UndefinedError, ...)
        if isinstance(e, (KeyboardInterrupt, MemoryError)):
            raise
        raise ChatTemplateError(f"the model's chat template failed to render: "
                                f"{type(e).__name__}: {e}") from None
