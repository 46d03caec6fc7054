"""Grammar-backend interface: compile a :class:`Constraint` once, match it per request.

``GrammarBackend.compile(constraint)`` (slow: milliseconds for xgrammar, up to seconds for
outlines; thread-safe, run it on :class:`~agentlang.runtime.grammar.cache.GrammarCache`'s pool) returns a
:class:`CompiledGrammar`, shared by all requests with that constraint. Each request gets its own
:class:`GrammarMatcher` from ``new_matcher()``; a matcher is not thread-safe and belongs to the
engine loop.

Token mask layout (shared by every backend and by :mod:`agentlang.runtime.grammar.mask`): an int32 tensor
``bitmask [N, ceil(V/32)]`` on CPU, token ``t`` allowed in row ``r`` iff
``(bitmask[r, t // 32] >> (t % 32)) & 1``; ``V`` is the model's logits width (``vocab_size``).

Special tokens are never allowed. Stop tokens (EOS) are allowed exactly when the text accepted so
far is a complete match; accepting one ends the match (``is_terminated()``).

Applying a bitmask to logits is a :data:`BitmaskKernel`, which a matcher names
(:meth:`GrammarMatcher.mask_kernel`): :func:`torch_bitmask_kernel` (pure torch, the reference)
unless its backend has a faster one. This module and the other backend-neutral ones
(``mask``, ``vocab``, ``completion``, ``budget``, ``jump_forward``, ``constraints``) import no
grammar library; everything xgrammar-specific lives in :mod:`agentlang.runtime.grammar.xgrammar_backend`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import torch

from agentlang.runtime.grammar.constraints import Constraint
from agentlang.runtime.grammar.vocab import TokenVocab

if TYPE_CHECKING:
    from agentlang.runtime.grammar.completion import ShortestCompletion
    from agentlang.runtime.grammar.token_table import TokenTable

BACKENDS = ("xgrammar", "outlines")

# (logits [N, V'] V' >= V, bitmask [N, ceil(V/32)] int32 on the logits' device, V, rows or None
# for all) -> None: set the logits of tokens < V whose bit is 0 to -inf, in the given rows only.
BitmaskKernel = Callable[[torch.Tensor, torch.Tensor, int, "Sequence[int] | None"], None]


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def bitmask_row_ids(row: torch.Tensor, vocab_size: int) -> list[int]:
    """Allowed token ids of one CPU bitmask row ``[ceil(V/32)] int32`` (little-endian words)."""
    import numpy as np

    bits = np.unpackbits(row.contiguous().numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab_size]).tolist()


def bitmask_allows(row: torch.Tensor, token_id: int) -> bool:
    """Whether bitmask row ``[ceil(V/32)] int32`` allows ``token_id``."""
    return bool((int(row[token_id // 32]) >> (token_id % 32)) & 1)


def ids_to_bitmask_row(ids, vocab_size: int) -> torch.Tensor:
    """The ``[ceil(V/32)] int32`` bitmask row with exactly ``ids`` set."""
    bits = torch.zeros(bitmask_width(vocab_size) * 32, dtype=torch.int64)
    bits[list(ids)] = 1
    words = (bits.view(-1, 32) << torch.arange(32, dtype=torch.int64)).sum(-1)  # [W] in [0, 2^32)
    return (words - (words >= 2**31).long() * 2**32).to(torch.int32)  # two's-complement wrap


def torch_bitmask_kernel(logits: torch.Tensor, bitmask: torch.Tensor, vocab_size: int,
                         rows: Sequence[int] | None) -> None:
    """The reference :data:`BitmaskKernel` in plain torch (any device; row by row, so memory
    stays ``O(V)``). Exact, but on CPU about 10x slower than xgrammar's kernel."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    for r in (range(logits.shape[0]) if rows is None else rows):
        allowed = ((bitmask[r].unsqueeze(-1) >> shifts) & 1).view(-1)[:vocab_size]  # [V]
        logits[r, :vocab_size].masked_fill_(allowed == 0, float("-inf"))


class GrammarMatcher(ABC):
    """Per-request matching state. All token ids are model vocabulary ids ``< vocab_size``."""

    vocab: TokenVocab

    @abstractmethod
    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (CPU int32 ``[N, ceil(V/32)]``,
        contiguous). Does not change the state. Once a stop token was accepted the row allows
        nothing; at a complete match that admits nothing more it allows only the stop tokens."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token. Returns False (state unchanged) for a token the mask forbids:
        an out-of-grammar token, a special token, a stop token before the match is complete,
        anything after termination."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True when the constrained output is finished: a stop token was accepted, or the text
        so far is a complete match that admits no further token (the engine should finish the
        request now instead of running a step whose mask only allows EOS)."""

    @abstractmethod
    def jump_forward_text(self) -> str:
        """The text the grammar forces next (e.g. ``'{"name":"'``), ``''`` when none: when more
        than one continuation is possible, when the output may end here, after termination.
        Only whole UTF-8 characters. Does not change the state: the caller tokenizes the text,
        feeds the tokens to ``accept_token`` (see :mod:`agentlang.runtime.grammar.jump_forward`)."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (stop tokens included). ``ValueError``
        if ``num_tokens`` exceeds :attr:`num_accepted` or the backend's rollback limit."""

    @property
    @abstractmethod
    def num_accepted(self) -> int:
        """Tokens accepted so far (net of rollbacks)."""

    @abstractmethod
    def can_end(self) -> bool:
        """Whether the text accepted so far is a complete match (a stop token is allowed now).
        Does not change the state."""

    @abstractmethod
    def state_key(self) -> Hashable:
        """A hashable summary of the matching state for memoising per-state results (see
        :mod:`agentlang.runtime.grammar.completion`). Equal states give equal keys; a backend whose
        state cannot be summarised exactly may give equal keys to different states (callers
        verify what they reuse)."""

    def parser_items(self) -> tuple[int, tuple[tuple[int, int, int, int, int], ...]] | None:
        """For backends whose state is a set of parser items: ``(position, items)`` with each
        item ``(rule, sequence, element, start position, sub element)``, positions counted in
        bytes (``position`` is the current step); ``None`` (the default) when :meth:`state_key` is exact."""
        return None

    def mask_kernel(self) -> BitmaskKernel:
        """The kernel that applies this matcher's bitmask rows to logits (every kernel obeys
        the same layout, so any of them may apply a batch mixing backends)."""
        return torch_bitmask_kernel

    def allowed_token_ids(self) -> list[int]:
        """The allowed next tokens as a sorted list (for tests and debugging; allocates)."""
        row = torch.zeros(1, bitmask_width(self.vocab.vocab_size), dtype=torch.int32)
        self.fill_mask(row, 0)
        return bitmask_row_ids(row[0], self.vocab.vocab_size)


class CompiledGrammar(ABC):
    """A compiled constraint for one vocabulary; immutable and shareable across requests
    (``completion`` memoises shortest completions per state, see
    :mod:`agentlang.runtime.grammar.completion`)."""

    constraint: Constraint
    completion: ShortestCompletion

    @abstractmethod
    def new_matcher(self) -> GrammarMatcher:
        """A fresh matcher at the start of the output. Cheap (microseconds)."""


class GrammarBackend(ABC):
    """Compiles constraints for one tokenizer vocabulary (``vocab``)."""

    name: str
    vocab: TokenVocab
    token_table: TokenTable  # vocabulary-level tables for shortest completions

    @abstractmethod
    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """Compile ``constraint``. Thread-safe. Raises ``ValueError`` naming the constraint
        field when this backend cannot enforce it (never drops part of a constraint)."""


def make_grammar_backend(
    name: str,
    tokenizer,
    vocab_size: int,
    *,
    stop_token_ids: list[int] | None = None,
    max_threads: int = 2,
) -> GrammarBackend:
    """``name`` in :data:`BACKENDS`. ``vocab_size`` is the model's logits width (49152 for
    SmolLM2), which the masks cover exactly. ``stop_token_ids`` default to the tokenizer's EOS.
    ``max_threads``: xgrammar's internal compile threads."""
    if name not in BACKENDS:
        raise ValueError(f"grammar_backend must be one of {BACKENDS}, got {name!r}")
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    from agentlang.runtime.grammar.vocab import build_vocab
    from agentlang.runtime.grammar.xgrammar_backend import decoded_vocab

    # xgrammar's tokenizer decoder (byte-level BPE, SentencePiece byte fallback, raw) serves
    # both backends: the vocabulary is backend-neutral once decoded.
    vocab = build_vocab(tokenizer, vocab_size, decoded_vocab(tokenizer, vocab_size),
                        stop_token_ids)
    if name == "xgrammar":
        from agentlang.runtime.grammar.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(vocab, max_threads=max_threads)
    from agentlang.runtime.grammar.outlines_backend import OutlinesBackend

    return OutlinesBackend(vocab)
