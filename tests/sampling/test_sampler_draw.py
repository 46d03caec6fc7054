"""The seeded draw (:func:`~agentlang.runtime.sampling.sampler.draw`): the distribution it was
given, never a token of probability 0, the same token from the same generator state, and
greedy ties to the lowest id."""

import pytest
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


def test_the_native_draw_matches_the_torch_draw(native_lib):
    """sample.c inverts the same running sum at the same number as :func:`draw`: the same
    token for almost every u (a u within rounding of a boundary may differ), never a masked
    token, the chi-square fit of the distribution; every logit at -inf is refused."""
    torch.manual_seed(0)
    logits = torch.randn(5000) * 3
    logits[::7] = float("-inf")                                    # a grammar's mask
    probs = torch.softmax(logits / 0.7, -1)
    gen = torch.Generator().manual_seed(2)
    us = torch.rand(3000, generator=gen)
    same = 0
    picks = []
    for u in us.tolist():
        tok = native_lib.sample_row(logits, 0.7, u)
        assert logits[tok] != float("-inf")
        cum = probs.cumsum(0)
        ref = int(torch.searchsorted(cum, u * cum[-1], right=True))
        same += tok == min(ref, 4999)
        picks.append(tok)
    assert same >= 2990
    top = probs.topk(5).indices
    counts = torch.tensor([sum(p == t for p in picks) for t in top.tolist()], dtype=torch.float64)
    expected = probs[top].double() * len(picks)
    assert float(((counts - expected) ** 2 / expected).sum()) < 20.5    # 5 dof, p = 0.001
    with pytest.raises(ValueError, match="-inf"):
        native_lib.sample_row(torch.full((100,), float("-inf")), 1.0, 0.5)
    only = torch.full((3000,), float("-inf"))
    only[2999] = 0.0
    assert native_lib.sample_row(only, 0.5, 0.999999) == 2999


def test_unfiltered_rows_take_the_native_draw_with_the_same_generator_use():
    """Rows without top-k/p/min-p: the same seed gives the same tokens run after run, and the
    generator advances by one number a row either way (later draws stay in step)."""
    torch.manual_seed(1)
    logits = torch.randn(3, 2000)
    p = SamplingParams(temperature=0.9, seed=3)
    gens = [torch.Generator().manual_seed(3) for _ in range(2)]
    a = [choose_tokens(logits.clone(), [RowSpec(p, gens[0])])[0] for _ in range(5)]
    b = [choose_tokens(logits.clone(), [RowSpec(p, gens[1])])[0] for _ in range(5)]
    assert a == b
    assert torch.equal(gens[0].get_state(), gens[1].get_state())
    ref = torch.Generator().manual_seed(3)
    for _ in range(5):
        torch.rand((), generator=ref)
    assert torch.equal(gens[0].get_state(), ref.get_state())
