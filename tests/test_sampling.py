"""The shared sampling transform, against brute-force references on small vocabularies."""

from __future__ import annotations

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams, logits_to_probs, make_generator, sample_from_probs


def reference_probs(logits: torch.Tensor, t: float, k: int, p: float, min_p: float) -> torch.Tensor:
    """Readable per-token reference: temperature → top-k → top-p → min-p, then renormalise."""
    probs = torch.softmax(logits.double() / t, -1)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if k > 0:
        kth = sorted(logits.tolist(), reverse=True)[k - 1]
        keep &= logits >= kth
    probs = torch.where(keep, probs, 0) / torch.where(keep, probs, 0).sum()
    if p < 1:
        order = sorted(range(len(probs)), key=lambda i: -probs[i].item())
        mass, nucleus = 0.0, set()
        for i in order:
            if mass >= p:
                break
            nucleus.add(i)
            mass += probs[i].item()
        keep = torch.tensor([i in nucleus for i in range(len(probs))])
        probs = torch.where(keep, probs, 0)
    if min_p > 0:
        probs = torch.where(probs >= min_p * probs.max(), probs, 0)
    return (probs / probs.sum()).float()


@pytest.mark.parametrize("t,k,p,min_p", [(1.0, 0, 1.0, 0.0), (0.7, 3, 1.0, 0.0), (1.0, 0, 0.8, 0.0), (1.3, 5, 0.9, 0.0),
                                         (1.0, 0, 1.0, 0.2), (0.5, 4, 0.7, 0.1)])
def test_transform_matches_reference(t, k, p, min_p):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 10, generator=gen) * 2
    params = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=min_p)
    got = logits_to_probs(logits, params)
    for row in range(6):  # rows are independent
        torch.testing.assert_close(got[row], reference_probs(logits[row], t, k, p, min_p), atol=1e-6, rtol=1e-5)
        if k:
            assert int((got[row] > 0).sum()) <= k


def test_top_p_keeps_the_boundary_token():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = logits_to_probs(logits, SamplingParams(top_p=0.6))
    assert (probs > 0).tolist() == [True, True, False, False]  # 0.5 < 0.6, so 0.3 joins; then mass ≥ 0.6


def test_greedy_is_one_hot_argmax_lowest_id_on_ties():
    probs = logits_to_probs(torch.tensor([1.0, 3.0, 3.0, 0.0]), SamplingParams(temperature=0))
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(min_p=1.0), "min_p"), (dict(top_k=-2), "top_k"), (dict(max_tokens=0), "max_tokens"), (dict(stop=[""]), "stop"),
])
def test_invalid_params_are_clear_errors(kwargs, message):
    with pytest.raises(SpecdecError, match=message):
        SamplingParams(**kwargs)


def test_seeded_sampling_is_reproducible_and_never_picks_zero_mass():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    a = [sample_from_probs(probs, make_generator(7)) for _ in range(3)]
    gen1, gen2 = make_generator(11), make_generator(11)
    seq1 = [sample_from_probs(probs, gen1) for _ in range(200)]
    seq2 = [sample_from_probs(probs, gen2) for _ in range(200)]
    assert seq1 == seq2 and len(set(a)) == 1
    assert set(seq1) == {1, 3}
