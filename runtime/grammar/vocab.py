"""The token vocabulary as the grammar backends see it: raw bytes per id, special and stop ids.

Built once per (tokenizer, model vocab size). Special tokens (every added token marked special,
e.g. ``<|im_start|>``, ``<|endoftext|>``) and ids past the tokenizer's vocabulary (padding up to
the model's ``vocab_size``) have no text: no grammar can ever match them, so they are never
allowed inside constrained output. Stop tokens are allowed exactly where the grammar may end.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class TokenVocab:
    token_bytes: tuple[bytes, ...]   # [vocab_size]; b"" for special / padding ids
    special_ids: frozenset[int]      # never allowed in constrained output (stop ids excluded)
    stop_ids: tuple[int, ...]        # allowed only where the grammar can end
    vocab_size: int                  # the model's logits width (mask covers exactly this)
    key: str                         # identity for caches: hash of all of the above

    def __post_init__(self) -> None:
        assert len(self.token_bytes) == self.vocab_size
        assert self.stop_ids and all(0 <= t < self.vocab_size for t in self.stop_ids)


def build_vocab(
    tokenizer, vocab_size: int, decoded: Sequence[bytes],
    stop_token_ids: Sequence[int] | None = None,
) -> TokenVocab:
    """The vocabulary of a Hugging Face tokenizer whose tokens decode to ``decoded[id]`` (raw
    bytes, ``vocab_size`` entries, ``b""`` for ids without text: see
    :func:`agentlang.runtime.grammar.xgrammar_backend.decoded_vocab`). ``stop_token_ids`` defaults to
    ``[tokenizer.eos_token_id]``."""
    if stop_token_ids is None:
        if tokenizer.eos_token_id is None:
            raise ValueError("stop_token_ids: the tokenizer has no eos_token_id; pass them explicitly")
        stop_token_ids = [tokenizer.eos_token_id]
    stop_ids = tuple(dict.fromkeys(int(t) for t in stop_token_ids))
    if not stop_ids or not all(0 <= t < vocab_size for t in stop_ids):
        raise ValueError(f"stop_token_ids: must be non-empty ids below vocab_size={vocab_size}")
    decoded = list(decoded)
    if len(decoded) != vocab_size:
        raise ValueError(f"decoded: {len(decoded)} token strings for vocab_size={vocab_size}")
    special = {i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special}
    special |= set(getattr(tokenizer, "all_special_ids", ()))
    special |= {i for i, b in enumerate(decoded) if not b}
    special = {i for i in special if i < vocab_size} - set(stop_ids)
    for i in special | set(stop_ids):
        decoded[i] = b""
    h = hashlib.sha256()
    for b in decoded:
        h.update(len(b).to_bytes(4, "little") + b)
    h.update(repr((sorted(special), stop_ids, vocab_size)).encode())
    return TokenVocab(tuple(decoded), frozenset(special), stop_ids, vocab_size, h.hexdigest()[:16])
