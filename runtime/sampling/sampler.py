"""Token sampling for one step: penalties, bans, greedy / temperature / top-k / top-p / min-p,
per-request seeded generators, and logprobs.

Rows are independent: a row's result depends only on its own logits, parameters and generator,
never on which other requests share the batch. Grammar masks are not applied here: constrained
rows go through :mod:`agentlang.runtime.engine.constrained_step`, which applies the mask between
:func:`prepare_logits` and :func:`choose_tokens` (the order :func:`sample` uses).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from agentlang.runtime.quant.native import qmatmul_library
from agentlang.runtime.sampling.params import SamplingParams


class TokenLogprob(NamedTuple):
    token_id: int
    logprob: float
    top: list[tuple[int, float]]   # top-k alternatives (token_id, logprob), best first


@dataclass
class RowSpec:
    """What the sampler needs to know about one row of logits."""

    params: SamplingParams
    generator: torch.Generator | None = None
    prompt_ids: Sequence[int] = ()
    output_ids: Sequence[int] = ()
    banned_ids: Sequence[int] = ()     # e.g. EOS while min_tokens is not reached
    logprobs: int | None = None        # top-k alternatives wanted, None = no logprobs
    extra: dict = field(default_factory=dict)


def apply_penalties(logits: torch.Tensor, spec: RowSpec) -> None:
    """In place on one row ``[V]``: repetition (prompt+output), frequency/presence (output)."""
    p = spec.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(spec.prompt_ids) | set(spec.output_ids)), dtype=torch.long)
        if seen.numel():
            vals = logits[seen]
            logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty,
                                       vals * p.repetition_penalty)
            logits.clamp_(max=torch.finfo(logits.dtype).max)   # a tiny penalty overflows
    if (p.frequency_penalty or p.presence_penalty) and spec.output_ids:
        ids, counts = torch.tensor(list(spec.output_ids), dtype=torch.long).unique(return_counts=True)
        logits[ids] -= p.frequency_penalty * counts.to(logits.dtype) + p.presence_penalty


def filter_probs(probs: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """top-k, top-p, min-p on one row of probabilities ``[V]``; returns renormalized probs."""
    if p.top_k > 0 and p.top_k < probs.shape[0]:
        kth = torch.topk(probs, p.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, 0.0)
    if p.top_p < 1.0:
        sp, idx = probs.sort(descending=True)
        cum = sp.cumsum(0)
        keep = (cum - sp) < p.top_p * cum[-1]
        keep[0] = True          # the most likely token, even where top_p * sum underflows to 0
        probs = torch.zeros_like(probs).scatter_(0, idx, torch.where(keep, sp, 0.0))
    if p.min_p > 0.0:
        probs = torch.where(probs >= p.min_p * probs.max(), probs, 0.0)
    return probs / probs.sum()


def top_logprobs(logprobs: torch.Tensor, token: int, k: int) -> TokenLogprob:
    """Chosen token's logprob plus the top-k alternatives of one row ``[V]``, best first; equal
    logprobs (exact ties are common in bf16) in token-id order, the order greedy's argmax
    breaks ties in, so a greedy token is always first among its equals."""
    top: list[tuple[int, float]] = []
    if k > 0:
        vals, ids = torch.topk(logprobs, k)
        top = sorted(zip(ids.tolist(), vals.tolist()), key=lambda t: (-t[1], t[0]))
    return TokenLogprob(token, float(logprobs[token]), top)


def model_logprobs(logits: torch.Tensor, specs: Sequence[RowSpec]) -> torch.Tensor | None:
    """``log_softmax`` of the untouched logits ``[N, V]`` when some row wants logprobs (they
    report the model's distribution, before penalties, bans and masks), else ``None``."""
    if any(s.logprobs is not None for s in specs):
        return torch.log_softmax(logits, dim=-1)
    return None


def changes_logits(spec: RowSpec) -> bool:
    """Whether :func:`prepare_logits` would change this row (a penalty or a banned token)."""
    p = spec.params
    return bool(p.repetition_penalty != 1.0 or spec.banned_ids
                or ((p.frequency_penalty or p.presence_penalty) and spec.output_ids))


def prepare_logits(logits: torch.Tensor, specs: Sequence[RowSpec]) -> None:
    """Penalties and banned tokens, in place on ``logits [N, V]``."""
    for i, s in enumerate(specs):
        apply_penalties(logits[i], s)
        if s.banned_ids:
            logits[i, list(s.banned_ids)] = float("-inf")


def choose_tokens(logits: torch.Tensor, specs: Sequence[RowSpec]) -> list[int]:
    """One token per row of prepared (and possibly masked) ``logits [N, V]``: greedy rows by
    argmax (ties to the lowest id), the others drawn with their generator."""
    # greedy for every row first; max(dim) returns the first of equal maxima, as argmax does,
    # in well under half argmax's time on CPU
    tokens = logits.max(dim=-1).indices.tolist()
    for i, s in enumerate(specs):
        if s.params.greedy:
            continue
        row = logits[i]
        native = qmatmul_library() if unfiltered(s.params) and row.device.type == "cpu" else None
        if native is not None and row.dtype == torch.float32 and row.is_contiguous():
            u = torch.rand((), generator=s.generator, dtype=torch.float32)   # draw()'s number
            tokens[i] = native.sample_row(row, s.params.temperature, float(u))
            continue
        probs = torch.softmax((row - row.max()) / s.params.temperature, dim=-1)
        probs = filter_probs(probs, s.params)
        if s.generator is not None:  # a seeded generator lives on the CPU: sample there
            probs = probs.to(s.generator.device)
        tokens[i] = draw(probs, s.generator)
    return tokens


def unfiltered(p: SamplingParams) -> bool:
    """Whether ``p`` samples from the whole softmax (no top-k, top-p or min-p): such a row is
    drawn in one native call where the library runs (``sample.c``, the same inversion of the
    running sum as :func:`draw`, from the same one number of the generator)."""
    return p.top_k <= 0 and p.top_p >= 1.0 and p.min_p <= 0.0


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token drawn from ``probs [V]`` (non-negative, not all zero) by inverting its
    cumulative sum at one uniform number of ``generator``: token ``i`` with probability
    ``probs[i] / probs.sum()``, never a token of probability 0. ``torch.multinomial`` draws an
    exponential number for every token of the vocabulary (~1 ms a row at 49k tokens on CPU);
    this costs one running sum and one number (~25x less). The same generator state gives the
    same token."""
    cum = probs.cumsum(0)                                                 # [V]
    u = torch.rand((), generator=generator, device=probs.device, dtype=cum.dtype)
    i = int(torch.searchsorted(cum, u * cum[-1], right=True))          # first cum[i] > u * sum
    if i >= cum.shape[0] or probs[i] <= 0:   # u * sum rounded up to the sum itself
        i = int(torch.nonzero(probs > 0)[-1])
    return i


def row_logprobs(raw_lp: torch.Tensor | None, tokens: Sequence[int],
                 specs: Sequence[RowSpec]) -> list[TokenLogprob | None]:
    """Each row's :class:`TokenLogprob` for its token (``None`` where not wanted); ``raw_lp``
    from :func:`model_logprobs`."""
    return [None if s.logprobs is None else top_logprobs(raw_lp[i], tokens[i], s.logprobs)
            for i, s in enumerate(specs)]


def sample(logits: torch.Tensor, specs: Sequence[RowSpec]) -> tuple[list[int], list[TokenLogprob | None]]:
    """Pick one token per unconstrained row. logits: [N, V] float32 (modified in place)."""
    assert logits.shape[0] == len(specs)
    raw_lp = model_logprobs(logits, specs)                    # [N, V] or None
    prepare_logits(logits, specs)
    tokens = choose_tokens(logits, specs)
    return tokens, row_logprobs(raw_lp, tokens, specs)
