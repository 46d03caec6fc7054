"""The seeded draw (:func:`~agentlang.runtime.sampling.sampler.draw`): the distribution it was
given, never a token of probability 0, the same token from the same generator state, and
greedy ties to the lowest id."""

import torch

from agentlang.runtime import SamplingParams
from agentlang.runtime.sampling.sampler import RowSpec, choose_tokens, draw


def test_draw_follows_the_distribution():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    gen = torch.Generator().manual_seed(0)
    n = 20000
    counts = torch.bincount(torch.tensor([draw(probs, gen) for _ in range(n)]),
                            minlength=probs.numel()).double()
    assert counts[probs == 0].sum() == 0
    expected = probs.double() * n
    nz = probs > 0
    chi2 = float(((counts[nz] - expected[nz]) ** 2 / expected[nz]).sum())
    assert chi2 < 16.3       # chi-square, 3 degrees of freedom, p = 0.001


def test_draw_takes_unnormalized_weights_and_edge_numbers():
    probs = torch.tensor([0.0, 2.0, 0.0, 6.0, 0.0])
    gen = torch.Generator().manual_seed(3)
    seen = {draw(probs, gen) for _ in range(500)}
    assert seen == {1, 3}
    one = torch.zeros(49152)
    one[49151] = 1e-30                                  # the only token, the last one
    assert draw(one, torch.Generator().manual_seed(1)) == 49151


def test_the_same_seed_gives_the_same_tokens():
    torch.manual_seed(0)
    logits = torch.randn(4, 1000) * 2
    p = SamplingParams(temperature=0.8, top_p=0.95, seed=7)

    def run():
        gens = [torch.Generator().manual_seed(7 + i) for i in range(4)]
        return [choose_tokens(logits.clone(), [RowSpec(p, g) for g in gens]) for _ in range(3)]

    assert run() == run()


def test_greedy_ties_go_to_the_lowest_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.5, 0.5, 0.5, 0.5]]).to(torch.bfloat16)
    p = SamplingParams(temperature=0)
    assert choose_tokens(logits, [RowSpec(p), RowSpec(p)]) == [1, 0]
