"""How ``select`` turns per-token log-probabilities of each choice into a decision.

Same three methods as SGLang: token-length-normalized (default), greedy token selection and
unconditional-likelihood-normalized. A method receives, for every choice, the log-probabilities
of its tokens given the prompt (and, when it asks for them, given an empty prompt).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ChoiceDecision:
    index: int
    decision: str
    scores: list[float]       # one per choice; higher is better
    meta: dict


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("-inf")


def _argmax_first(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


class ChoicesMethod(ABC):
    """Base class. ``requires_unconditional`` asks the executor for empty-prompt logprobs."""

    name = "base"
    requires_unconditional = False

    @abstractmethod
    def __call__(self, choices: list[str], logprobs: list[list[float]],
                 unconditional: list[list[float]] | None = None) -> ChoiceDecision:
        """Pick one of ``choices`` from their per-token logprobs."""

    def __repr__(self) -> str:
        return self.name


class TokenLengthNormalized(ChoicesMethod):
    """Highest mean token logprob."""

    name = "token_length_normalized"

    def __call__(self, choices, logprobs, unconditional=None):
        scores = [_mean(lp) for lp in logprobs]
        i = _argmax_first(scores)
        return ChoiceDecision(i, choices[i], scores,
                              {"normalized_prompt_logprobs": scores, "token_logprobs": logprobs})


class GreedyTokenSelection(ChoicesMethod):
    """Compare choices token by token, keeping the best at each position.

    A shorter choice is padded with its own mean logprob so it can be compared to longer ones.
    """

    name = "greedy_token_selection"

    def __call__(self, choices, logprobs, unconditional=None):
        width = max(len(lp) for lp in logprobs)
        matrix = [list(lp) + [_mean(lp)] * (width - len(lp)) for lp in logprobs]
        remaining = list(range(len(choices)))
        for j in range(width):
            best = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == best]
            if len(remaining) == 1:
                break
        i = remaining[0]
        scores = [1.0 if k == i else 0.0 for k in range(len(choices))]
        return ChoiceDecision(i, choices[i], scores,
                              {"greedy_logprob_matrix": matrix, "token_logprobs": logprobs})


class UnconditionalLikelihoodNormalized(ChoicesMethod):
    """Highest mean of (logprob given prompt − logprob given no prompt) per token.

    The first unconditional logprob has no context and counts as 0.
    """

    name = "unconditional_likelihood_normalized"
    requires_unconditional = True

    def __call__(self, choices, logprobs, unconditional=None):
        if unconditional is None:
            raise ValueError("unconditional_likelihood_normalized needs unconditional logprobs")
        scores = []
        for cond, uncond in zip(logprobs, unconditional):
            uncond = [0.0 if k == 0 or u is None or math.isinf(u) else u
                      for k, u in enumerate(uncond)]
            # Equal lengths: the mean per-token difference. If the choice tokenizes differently
            # after the prompt than alone, compare totals per conditional token.
            scores.append((sum(cond) - sum(uncond)) / max(len(cond), 1))
        i = _argmax_first(scores)
        return ChoiceDecision(i, choices[i], scores,
                              {"normalized_unconditional_prompt_logprobs": scores,
                               "token_logprobs": logprobs, "unconditional_token_logprobs":
                               unconditional})


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
