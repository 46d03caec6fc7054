"""Exact draft verification, one rule for jump-forward's forced text and speculation's
context copies: a draft token is kept while the token the model itself samples at its row
(masked by the grammar, settled by the budget guard) equals it; the first difference is the
step's last token. :func:`verify_rows` is the rule over a ``pick`` callback (the constrained
step samples each row with the request's own generator); :func:`verify_draft` runs it over
logits a caller computed itself (tests against HF transformers)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from agentlang.runtime.grammar import mask as grammar_mask

if TYPE_CHECKING:
    from agentlang.runtime.grammar.base import GrammarMatcher


def verify_draft(
    matcher: GrammarMatcher,
    draft: Sequence[int],
    logits: torch.Tensor,
    sample: Callable[[int, torch.Tensor], int],
    settle: Callable[[int, int], int] | None = None,
) -> list[int]:
    """Exact jump-forward: keep the draft tokens the model itself would have produced.

    The caller ran one extend step over ``[last sampled token] + draft``; ``logits
    [len(draft) + 1, V]`` are its logits at those positions (row i predicts the token after
    ``draft[:i]``). Row by row: mask with the matcher's current state (in place), call
    ``sample(i, row [1, V]) -> token`` (greedy, temperature, seeded RNG, ...), accept the token,
    let ``settle(i, token) -> token`` replace it (a budget guard; the matcher then holds the
    replacement); continue while it equals ``draft[i]``. Returns the accepted tokens: a prefix
    of ``draft`` plus the first token that differs (or the token after a fully matched draft);
    stops early when the matcher terminates. KV entries of draft tokens past
    ``len(result) - 1`` are stale; the last returned token has no KV yet. ``ValueError`` for
    logits of the wrong shape or a sampled token the mask forbids.
    """
    if logits.dim() != 2 or logits.shape[0] != len(draft) + 1:
        raise ValueError(f"logits must be [{len(draft) + 1}, V], got {tuple(logits.shape)}")

    def pick(i: int) -> int:
        row = logits[i : i + 1]                          # [1, V]
        grammar_mask.apply_grammar_masks(row, [matcher])
        return int(sample(i, row))

    out = verify_rows(matcher, draft, pick, settle)
    assert out is not None              # pick always returns a token
    return out


def verify_rows(matcher: GrammarMatcher | None, draft: Sequence[int],
                pick: Callable[[int], int | None],
                settle: Callable[[int, int], int] | None) -> list[int] | None:
    """Accept ``pick(i)`` (a token sampled from row i, under the matcher's mask if there is a
    matcher) for i = 0, 1, ... while the settled token matches ``draft[i]``; see
    :func:`verify_draft`. ``None`` when ``pick`` finds no allowed token (the matcher keeps the
    tokens accepted before)."""
    out: list[int] = []
    for i in range(len(draft) + 1):
        token = pick(i)
        if token is None:
            return None
        if matcher is not None and not matcher.accept_token(token):
            raise ValueError(f"sample returned token {token}, which the grammar mask forbids")
        if settle is not None:
            token = settle(i, token)
        out.append(token)
        if i == len(draft) or token != draft[i] or (matcher is not None
                                                    and matcher.is_terminated()):
            break
    return out
