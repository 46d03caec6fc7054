"""The vocabulary's side of shortest completions (:mod:`agentlang.runtime.grammar.completion`):
the byte alphabet the search walks, each byte's one-byte token, and the fewest-token split of
a byte string. One :class:`TokenTable` per grammar backend, shared by its compiled grammars."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentlang.runtime.grammar.vocab import TokenVocab

# Tab, newline, printable ASCII without the backslash (escapes never shorten a completion and
# multiply the search states inside strings); "1" is tried before "0" (a year, month or day of
# zeros is not a date, and "0" and "1" are equally short).
ALPHABET = b"\t\n" + b"".join(bytes([b]) for b in b" !\"#$%&'()*+,-./123456789" + b"0" +
                                bytes(range(0x3A, 0x7F)) if b != 0x5C)


class TokenTable:
    """Vocabulary-level tables shared by every compiled grammar of one backend: the one-byte
    token of each byte and the fewest-token split of a byte string. Immutable after
    construction except for the split memo (idempotent writes: thread-safe under the GIL)."""

    def __init__(self, vocab: TokenVocab):
        self.vocab = vocab
        self.by_bytes: dict[bytes, int] = {}
        for i, b in enumerate(vocab.token_bytes):
            if b and b not in self.by_bytes:
                self.by_bytes[b] = i
        self.max_len = max((len(b) for b in self.by_bytes), default=1)
        self.byte_tokens = tuple((b, self.by_bytes[bytes([b])]) for b in ALPHABET
                                 if bytes([b]) in self.by_bytes)
        self._splits: dict[bytes, tuple[int, ...] | None] = {}

    def fewest_tokens(self, data: bytes) -> tuple[int, ...] | None:
        """The split of ``data`` into the fewest vocabulary tokens (``None`` if some byte has
        no token)."""
        if data in self._splits:
            return self._splits[data]
        n = len(data)
        best: list[tuple[int, int] | None] = [None] * (n + 1)  # end -> (count, token)
        best[0] = (0, -1)
        for end in range(1, n + 1):
            for start in range(max(0, end - self.max_len), end):
                if best[start] is None:
                    continue
                tok = self.by_bytes.get(data[start:end])
                if tok is not None and (best[end] is None or best[start][0] + 1 < best[end][0]):
                    best[end] = (best[start][0] + 1, tok)
        split: tuple[int, ...] | None = None
        if best[n] is not None:
            out: list[int] = []
            end = n
            while end > 0:
                tok = best[end][1]
                out.append(tok)
                end -= len(self.vocab.token_bytes[tok])
            split = tuple(reversed(out))
        self._splits[data] = split
        return split
