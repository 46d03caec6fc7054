"""Apply the grammar masks of a whole batch to its logits in one op.

Two halves, so the engine can fill the masks on the CPU while the model runs, then apply them
to the logits when they arrive: :func:`fill_grammar_bitmask` (CPU, per constrained row) and
:func:`apply_grammar_bitmask` (one kernel over the batch: the one the matchers name, see
:meth:`GrammarMatcher.mask_kernel`; xgrammar's CPU or GPU kernel for both backends today, which
hands float32 CPU logits to the native library's).
:func:`apply_grammar_masks` does both. Only rows with a matcher are filled and masked;
a batch without constrained rows returns before allocating anything, and unconstrained rows are
never read or written.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from agentlang.runtime.grammar.base import (BitmaskKernel, GrammarMatcher, bitmask_width,
                                  torch_bitmask_kernel)


class FilledBitmask(NamedTuple):
    bitmask: torch.Tensor  # CPU int32 [>= batch, ceil(V/32)]; only `rows` are filled
    rows: list[int]        # batch rows that have a matcher (non-empty)
    batch: int             # N: rows in the logits this mask is for
    vocab_size: int        # V
    kernel: BitmaskKernel = torch_bitmask_kernel   # applies it (the first matcher's)


def fill_grammar_bitmask(
    matchers: Sequence[GrammarMatcher | None],
    vocab_size: int,
    bitmask: torch.Tensor | None = None,
) -> FilledBitmask | None:
    """Fill the next-token bitmask of every row that has a matcher; ``None`` when none has.

    ``bitmask``: optional reusable CPU int32 buffer ``[>= N, ceil(V/32)]`` (pin it when the
    logits live on a GPU); else one is allocated. ``vocab_size`` (the logits width) must equal
    the matchers' ``vocab.vocab_size``.
    """
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return None
    n, width = len(matchers), bitmask_width(vocab_size)
    if bitmask is None:
        bitmask = torch.empty(n, width, dtype=torch.int32)  # rows not in `rows` are never read
    elif bitmask.shape[0] < n or bitmask.shape[1] != width or bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32 [>= {n}, {width}], got {tuple(bitmask.shape)}")
    for i in rows:
        m = matchers[i]
        if m.vocab.vocab_size != vocab_size:
            raise ValueError(
                f"logits width {vocab_size} != grammar vocab_size {m.vocab.vocab_size} (row {i}); "
                "build the grammar backend with the model's vocab_size"
            )
        m.fill_mask(bitmask, i)
    return FilledBitmask(bitmask, rows, n, vocab_size, matchers[rows[0]].mask_kernel())


def apply_grammar_bitmask(logits: torch.Tensor, filled: FilledBitmask | None) -> None:
    """Set forbidden logits to ``-inf`` in place (``logits [N, V]`` float32/bf16/fp16, any
    device). No-op for ``None``."""
    if filled is None:
        return
    if logits.dim() != 2 or tuple(logits.shape) != (filled.batch, filled.vocab_size):
        raise ValueError(
            f"logits must be [{filled.batch}, {filled.vocab_size}], got {tuple(logits.shape)}"
        )
    mask = filled.bitmask[: filled.batch]
    if logits.device.type != "cpu":
        mask = mask.to(logits.device, non_blocking=mask.is_pinned())
    rows = filled.rows if len(filled.rows) < filled.batch else None
    filled.kernel(logits, mask, filled.vocab_size, rows)


def apply_grammar_masks(
    logits: torch.Tensor,
    matchers: Sequence[GrammarMatcher | None],
    bitmask: torch.Tensor | None = None,
) -> None:
    """Fill and apply in one call: ``logits [N, V]``, ``matchers[i]`` is row i's matcher or
    ``None``; see :func:`fill_grammar_bitmask` for ``bitmask``."""
    if logits.dim() != 2 or len(matchers) != logits.shape[0]:
        raise ValueError(
            f"logits must be [N, V] with N == len(matchers), got {tuple(logits.shape)} "
            f"for {len(matchers)} matchers"
        )
    apply_grammar_bitmask(logits, fill_grammar_bitmask(matchers, logits.shape[1], bitmask))
