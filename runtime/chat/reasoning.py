"""A reasoning block (Qwen3's ``<think>…</think>``) split from the answer, incrementally: the
streamed route feeds each delta, the plain route feeds the whole text; both get the same split.

The block counts only at the very start of the output (leading whitespace aside); its text goes
to ``reasoning_content`` and what follows ``</think>`` (its leading blank lines dropped) is the
answer. Text that could still be the start of ``<think>`` or of ``</think>`` is held back until
the next delta decides it; an output cut inside the block is all reasoning. ``forced``: the
template already opened the block (DeepSeek-R1, Qwen3 thinking models), so the output starts
inside it and everything up to ``</think>`` is reasoning.

:data:`MODEL_TYPES` names the models by SGLang's reasoning-parser names (its
``separate_reasoning(model_type=...)`` and ``--reasoning-parser``) for the formats read here.
"""

from __future__ import annotations

from agentlang.runtime.grammar.tool_format import REASONING

# SGLang's model-type names of the <think> formats: (block, the template opens it)
MODEL_TYPES = {"qwen3": ("think", False), "glm45": ("think", False),
               "qwen3-thinking": ("think", True), "deepseek-r1": ("think", True),
               "minimax": ("think", True), "step3": ("think", True)}


class ReasoningSplit:
    """``feed(text) -> (reasoning delta, answer delta)``; ``flush()`` at the end."""

    def __init__(self, reasoning: str | None, forced: bool = False):
        begin, end = REASONING[reasoning] if reasoning else ("", "")
        self.begin, self.close = begin, end.strip()
        # start | inside | after | answer
        self.state = ("inside" if forced else "start") if reasoning else "answer"
        self.buf = ""
        self.reasoned = self.answered = False   # the block's / the answer's first text given

    def feed(self, text: str) -> tuple[str, str]:
        if self.state == "answer":
            return "", text
        self.buf += text
        if self.state == "start":
            s = self.buf.lstrip()
            if not s or (len(s) < len(self.begin) and self.begin.startswith(s)):
                return "", ""                                    # undecided
            if not s.startswith(self.begin):
                self.state, out, self.buf = "answer", self.buf, ""
                return "", out
            self.state, self.buf = "inside", s[len(self.begin):]
        if self.state == "inside":
            at = self.buf.find(self.close)
            if at < 0:
                keep = _partial_suffix(self.buf, self.close)
                out = self.buf[:len(self.buf) - keep]
                kept = len(out) - len(out.rstrip())           # trailing blanks: maybe the last
                out, self.buf = out[:len(out) - kept], self.buf[len(out) - kept:]
                return self._reasoning(out), ""
            reasoning, self.buf = self.buf[:at], self.buf[at + len(self.close):]
            self.state = "after"
            return self._reasoning(reasoning).rstrip(), self._after()
        return "", self._after()

    def _reasoning(self, text: str) -> str:
        """The block's leading newline (``<think>\\n``) dropped from its first text."""
        if not self.reasoned:
            text = text.lstrip("\n")
            self.reasoned = bool(text)
        return text

    def _after(self) -> str:
        out, self.buf = self.buf if self.answered else self.buf.lstrip(), ""
        self.answered = self.answered or bool(out)
        return out

    def flush(self) -> tuple[str, str]:
        """What is held back: the rest of a cut block (reasoning), or undecided text (answer)."""
        out, self.buf = self.buf, ""
        if self.state == "inside":
            return out.rstrip(), ""
        return "", out if self.state != "after" else out.lstrip()

    def split(self, text: str) -> tuple[str | None, str]:
        """The whole output at once: ``(reasoning or None when there is no block, answer)``."""
        r1, a1 = self.feed(text)
        r2, a2 = self.flush()
        had_block = self.state in ("inside", "after")
        return (r1 + r2 if had_block else None), a1 + a2


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def split_reasoning(text: str, model_type: str) -> tuple[str, str]:
    """``(reasoning, answer)`` of a whole output of a ``model_type`` model (:data:`MODEL_TYPES`;
    reasoning ``""`` when there is no block, as SGLang's parser gives)."""
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r}: accepted {', '.join(MODEL_TYPES)}")
    block, forced = MODEL_TYPES[model_type]
    reasoning, answer = ReasoningSplit(block, forced).split(text)
    return reasoning or "", answer
