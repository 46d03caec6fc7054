"""Jump-forward: turn the grammar's forced text into tokens without one decode step per token.

Two modes. **Exact** (:func:`draft_tokens` here, verified by :mod:`agentlang.runtime.engine.constrained_step`):
the forced text is tokenized into a draft, the engine runs one extend step over it, and every
position is sampled from the model's own (masked) distribution; draft tokens are kept while
they match. Output is identical
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

from typing import NamedTuple, Sequence

from agentlang.runtime.grammar.base import GrammarMatcher


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
    """The grammar's forced text as a token draft (``[]`` when nothing is forced), at most
    ``max_tokens`` long, for exact jump-forward (verified by
    :func:`agentlang.runtime.engine.draft_verify.verify_draft`). The matcher is not changed."""
    text = matcher.jump_forward_text()
    if not text:
        return []
    return tokenizer.encode(text, add_special_tokens=False)[:max_tokens]
