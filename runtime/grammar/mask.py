"""Apply the grammar masks of a whole batch to its logits in one op.

Only rows with a matcher are filled and masked; a batch without constrained rows returns before
allocating anything, and unconstrained rows are never read or written.
"""

from __future__ import annotations

from typing import Sequence

import torch

from runtime.grammar.base import GrammarMatcher, bitmask_width


def apply_grammar_masks(
    logits: torch.Tensor,
    matchers: Sequence[GrammarMatcher | None],
    bitmask: torch.Tensor | None = None,
) -> None:
    """Set the logits of tokens each row's grammar forbids to ``-inf``, in place.

    ``logits [N, V]`` float32/bf16/fp16 on any device; ``matchers[i]`` is row i's matcher or
    ``None``. ``V`` must equal the matchers' ``vocab.vocab_size``. ``bitmask``: optional
    reusable CPU int32 buffer ``[>= N, ceil(V/32)]`` (pinned, for GPU logits); else one is
    allocated for this call.
    """
    if logits.dim() != 2 or len(matchers) != logits.shape[0]:
        raise ValueError(
            f"logits must be [N, V] with N == len(matchers), got {tuple(logits.shape)} "
            f"for {len(matchers)} matchers"
        )
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return
    import xgrammar as xgr

    n, vocab = logits.shape
    width = bitmask_width(vocab)
    if bitmask is None:
        bitmask = torch.empty(n, width, dtype=torch.int32)  # rows not in `rows` are never read
    elif bitmask.shape[0] < n or bitmask.shape[1] != width or bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32 [>= {n}, {width}], got {tuple(bitmask.shape)}")
    for i in rows:
        m = matchers[i]
        if m.vocab.vocab_size != vocab:
            raise ValueError(
                f"logits width {vocab} != grammar vocab_size {m.vocab.vocab_size} (row {i}); "
                "build the grammar backend with the model's vocab_size"
            )
        m.fill_mask(bitmask, i)
    mask = bitmask[:n]
    if logits.device.type != "cpu":
        mask = mask.to(logits.device, non_blocking=mask.is_pinned())
    xgr.apply_token_bitmask_inplace(
        logits, mask, vocab_size=vocab, indices=rows if len(rows) < n else None
    )
