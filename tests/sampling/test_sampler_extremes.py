"""The sampler at the edges of the accepted ranges (found by schemathesis through the server):
a temperature, top_p or repetition_penalty as small as a double allows still samples a token
of the distribution's top, never a NaN probability (a 500 before)."""

import torch

from agentlang.runtime import SamplingParams
from agentlang.runtime.sampling.sampler import RowSpec, filter_probs, sample

TINY = 5e-324      # the smallest positive double: 0.0 in float32


def _logits() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(2, 50) * 3       # [N=2, V=50]


def test_tiny_top_p_keeps_the_most_likely_token():
    probs = torch.softmax(_logits()[0], -1)
    out = filter_probs(probs, SamplingParams(top_p=TINY))
    assert torch.isfinite(out).all() and out[probs.argmax()] == 1.0


def test_tiny_temperature_is_greedy():
    p = SamplingParams(temperature=TINY)
    assert p.greedy
    logits = _logits()
    tokens, _ = sample(logits.clone(), [RowSpec(p), RowSpec(p)])
    assert tokens == logits.argmax(-1).tolist()


def test_tiny_repetition_penalty_and_small_temperature_sample_a_top_token():
    logits = _logits()
    seen = logits[0].topk(3).indices.tolist()           # positive logits: x / TINY overflows
    p = SamplingParams(repetition_penalty=TINY, temperature=1e-3, top_p=TINY, seed=1)
    gen = torch.Generator().manual_seed(1)
    tokens, _ = sample(logits.clone(), [RowSpec(p, gen, prompt_ids=seen),
                                        RowSpec(p, gen)])
    assert tokens[0] in seen and tokens[1] == int(logits[1].argmax())
