"""Incremental detokenization with stop strings matched on text, across token boundaries."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def text_decoder(tokenizer, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """``ids -> tokenizer.decode(ids, skip_special_tokens=...)``; for a fast tokenizer without
    a clean-up pass, its backend's decode, which is what that call runs, without the
    per-call conversion of the ids in Python (2x less a call: 44 vs 81 µs for 300 ids)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False:
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


class OutputText:
    """The text of one completion as tokens arrive.

    ``append(token)`` decodes and looks for stop strings in the newly produced text (a stop may
    span several tokens). ``text`` is the final text (stop string excluded unless asked);
    ``take_delta()`` returns the part safe to stream: nothing that could still turn out to be
    the beginning of a stop string, and no half UTF-8 character.
    """

    def __init__(self, tokenizer, stop: Sequence[str] = (), include_stop: bool = False,
                 skip_special_tokens: bool = True):
        self.stop = list(stop)
        self.include_stop = include_stop
        self._decode = text_decoder(tokenizer, skip_special_tokens)
        self.ids: list[int] = []
        self.text = ""
        self.matched_stop: str | None = None
        self._sent = 0
        self._max_stop = max((len(s) for s in self.stop), default=0)

    def append(self, token_id: int) -> str | None:
        """Add a token; returns the stop string it completed, if any."""
        assert self.matched_stop is None, "append after a stop string matched"
        prev_len = len(self.text)
        self.ids.append(token_id)
        full = self._decode(self.ids)
        self.text = full
        if not self.stop:
            return None
        start = max(0, prev_len - self._max_stop + 1)
        hits = [(full.find(s, start), s) for s in self.stop]
        hits = [(pos, s) for pos, s in hits if pos >= 0]
        if not hits:
            return None
        pos, s = min(hits)
        self.text = full[: pos + len(s)] if self.include_stop else full[:pos]
        self.matched_stop = s
        return s

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens (jump-forward retokenization rolls back the tail)."""
        self.ids = self.ids[:n]
        self.text = self._decode(self.ids)
        self.matched_stop = None
        self._sent = min(self._sent, len(self.text))

    def take_delta(self, final: bool = False) -> str:
        """New text since the last call that can no longer change."""
        end = len(self.text)
        if not final:
            if self.text.endswith("\ufffd"):
                end -= 1
            for k in range(min(self._max_stop - 1, end), 0, -1):
                tail = self.text[end - k:end]
                if any(s.startswith(tail) for s in self.stop):
                    end -= k
                    break
        end = max(end, self._sent)
        delta = self.text[self._sent:end]
        self._sent = end
        return delta
