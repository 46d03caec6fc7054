"""Jump-forward: turn the grammar's forced text into tokens without one decode step per token.

Two modes. **Exact** (:func:`draft_tokens` + :func:`verify_draft`): the forced text is tokenized
into a draft, the engine runs one extend step over it, and every position is sampled from the
model's own (masked) distribution; draft tokens are kept while they match. Output is identical
to decoding without jump-forward (also under seeded sampling) and matched draft tokens cost no
extra forward passes. **Forced** (:func:`jump_forward`, SGLang-style): the forced tokens are
appended without consulting the model, retokenizing at the boundary as described below; it
saves more passes, but the model then sees canonical tokens it might not have chosen, so the
text that follows can differ from decoding without jump-forward.

Appending the tokens of the forced text after the model's last tokens can give a tokenization
the model never saw (``'"'`` + ``'name'`` where the tokenizer would write ``'"name'``). So the
last few output tokens are decoded, joined with the forced text and tokenized again; the common
prefix with the old tokens is kept, the rest is replaced. The matcher is rolled back and fed the
new tokens here; the engine must drop the same ``rollback`` tokens from the request (their KV
slots are stale) and append ``token_ids`` in one extend step.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import torch

from runtime.grammar.base import GrammarMatcher


class JumpForward(NamedTuple):
    rollback: int          # tokens to drop from the end of the request's output ids
    token_ids: list[int]   # tokens to append after that (already accepted by the matcher)
    text: str              # the forced text (decode(dropped + appended) == old tail + text)


def jump_forward(
    matcher: GrammarMatcher,
    tokenizer,
    output_ids: Sequence[int],
    window: int = 2,
) -> JumpForward | None:
    """Apply the matcher's forced continuation, if any; ``None`` when there is none.

    ``output_ids``: the request's generated ids so far, whose last ``matcher.num_accepted``
    ids are the ones the matcher accepted. Up to ``window`` trailing tokens are retokenized
    together with the forced text (fewer if they end inside a UTF-8 character). On return the
    matcher state is ``old tail[:-rollback] + token_ids``. If the new tokens are not accepted
    (should not happen), the matcher is restored and ``None`` returned.
    """
    text = matcher.jump_forward_text()
    if not text:
        return None
    k = min(window, len(output_ids), matcher.num_accepted)
    new_ids: list[int] = []
    tail: list[int] = []
    while k >= 0:
        tail = list(output_ids[len(output_ids) - k:]) if k else []
        prefix = _decode(tokenizer, tail)
        if "\ufffd" not in prefix:
            new_ids = tokenizer.encode(prefix + text, add_special_tokens=False)
            if _decode(tokenizer, new_ids) == prefix + text:
                break
        k -= 1
    if k < 0:
        return None
    keep = 0
    while keep < len(tail) and keep < len(new_ids) and tail[keep] == new_ids[keep]:
        keep += 1
    drop, add = len(tail) - keep, new_ids[keep:]
    if not add:
        return None
    matcher.rollback(drop)
    for n, t in enumerate(add):
        if not matcher.accept_token(t):
            matcher.rollback(n)
            for old in tail[keep:]:
                ok = matcher.accept_token(old)
                assert ok, "re-accepting previously accepted tokens failed"
            return None
    return JumpForward(drop, add, text)


def _decode(tokenizer, ids: list[int]) -> str:
    if not ids:
        return ""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def draft_tokens(matcher: GrammarMatcher, tokenizer, max_tokens: int = 32) -> list[int]:
    """The grammar's forced text as a token draft (``[]`` when nothing is forced), for exact
    jump-forward with :func:`verify_draft`. The matcher is not changed."""
    text = matcher.jump_forward_text()
    if not text:
        return []
    return tokenizer.encode(text, add_special_tokens=False)[:max_tokens]


def verify_draft(
    matcher: GrammarMatcher,
    draft: Sequence[int],
    logits: torch.Tensor,
    sample: Callable[[int, torch.Tensor], int],
    settle: Callable[[int, int], int] | None = None,
) -> list[int]:
    """Exact jump-forward: keep the draft tokens the model itself would have produced.

    The engine ran one extend step over ``[last sampled token] + draft``; ``logits
    [len(draft) + 1, V]`` are its logits at those positions (row i predicts the token after
    ``draft[:i]``). Row by row: mask with the matcher's current state (in place), call
    ``sample(i, row [1, V]) -> token`` (the request's own sampler: greedy, temperature, seeded
    RNG, penalties over the tokens accepted so far), accept the token; continue while it equals
    ``draft[i]``. Returns the accepted tokens: a prefix of ``draft`` plus the first token that
    differs (or the token after a fully matched draft). Every token is drawn from exactly the
    distribution sequential decoding would use, so outputs equal decoding without jump-forward
    (greedy: identical text) while a matched draft prefix costs no extra forward passes.
    KV entries of draft tokens past ``len(result) - 1`` are stale and must be dropped; the last
    returned token has no KV yet (like any sampled token). Stops early at a stop token or when
    the matcher terminates. ``settle(i, token) -> token``, called after each accept, may replace
    the token (the budget guard, :mod:`runtime.grammar.budget`, forcing a completion; the
    matcher then holds the replacement).
    """
    from runtime.grammar.mask import apply_grammar_masks

    if logits.dim() != 2 or logits.shape[0] != len(draft) + 1:
        raise ValueError(f"logits must be [{len(draft) + 1}, V], got {tuple(logits.shape)}")
    out: list[int] = []
    for i in range(len(draft) + 1):
        row = logits[i : i + 1]
        apply_grammar_masks(row, [matcher])
        token = int(sample(i, row))
        if not matcher.accept_token(token):
            raise ValueError(f"sample returned token {token}, which the grammar mask forbids")
        if settle is not None:
            token = settle(i, token)
        out.append(token)
        if i == len(draft) or token != draft[i] or matcher.is_terminated():
            break
    return out
