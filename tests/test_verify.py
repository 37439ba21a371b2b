"""Rejection sampler: the committed tokens are distributed exactly as the target's (χ², fixed seeds)."""

from __future__ import annotations

import pytest
import torch

from specdec.sampling import SamplingParams, logits_to_probs, make_generator, sample_from_probs
from specdec.stats_tests import chi_square_pvalue
from specdec.verify import greedy_verify, rejection_sample, verify

V = 6
TRIALS = 20_000


def random_dist(gen: torch.Generator, rows: int, sparsity: float = 0.0) -> torch.Tensor:
    x = torch.rand(rows, V, generator=gen) ** 3
    if sparsity:
        x = x * (torch.rand(rows, V, generator=gen) > sparsity)
        x[:, 0] += 1e-3
    return x / x.sum(-1, keepdim=True)


def first_token_counts(draft_probs, target_probs, gen, k, point_mass=False, trials=TRIALS):
    counts = [0] * V
    for _ in range(trials):
        if point_mass:
            tokens = torch.tensor([1] * k)
            _, nxt = rejection_sample(tokens, None, target_probs, gen)
            n_acc = _
        else:
            tokens = torch.tensor([sample_from_probs(draft_probs[i], gen) for i in range(k)])
            n_acc, nxt = rejection_sample(tokens, draft_probs, target_probs, gen)
        first = int(tokens[0]) if n_acc > 0 else nxt
        counts[first] += 1
    return counts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_first_token_has_target_distribution_dense_q(seed):
    gen = torch.Generator().manual_seed(seed)
    q, p = random_dist(gen, 2), random_dist(gen, 3, sparsity=0.3)
    counts = first_token_counts(q, p, make_generator(seed), k=2)
    assert chi_square_pvalue(counts, p[0].tolist()) > 1e-3


@pytest.mark.parametrize("seed", [0, 1])
def test_first_token_has_target_distribution_point_mass_q(seed):
    gen = torch.Generator().manual_seed(seed)
    p = random_dist(gen, 3)
    counts = first_token_counts(None, p, make_generator(seed), k=2, point_mass=True)
    assert chi_square_pvalue(counts, p[0].tolist()) > 1e-3


def test_second_token_given_first_accepted_has_target_distribution():
    """Chain: conditional on d_1 being committed, the next committed token ~ p_1 (accept d_2 or residual/bonus)."""
    gen = torch.Generator().manual_seed(5)
    q, p = random_dist(gen, 2), random_dist(gen, 3)
    sampler = make_generator(9)
    counts = [0] * V
    for _ in range(TRIALS * 2):
        tokens = torch.tensor([sample_from_probs(q[i], sampler) for i in range(2)])
        n_acc, nxt = rejection_sample(tokens, q, p, sampler)
        if n_acc >= 1 and int(tokens[0]) == 2:
            second = int(tokens[1]) if n_acc >= 2 else nxt
            counts[second] += 1
    assert sum(counts) > 1000
    assert chi_square_pvalue(counts, p[1].tolist()) > 1e-3


def test_identical_p_and_q_accept_everything_and_bonus_is_p_k():
    gen = torch.Generator().manual_seed(3)
    p = random_dist(gen, 4)
    sampler = make_generator(1)
    counts = [0] * V
    for _ in range(TRIALS):
        tokens = torch.tensor([sample_from_probs(p[i], sampler) for i in range(3)])
        n_acc, nxt = rejection_sample(tokens, p[:3], p, sampler)
        assert n_acc == 3
        counts[nxt] += 1
    assert chi_square_pvalue(counts, p[3].tolist()) > 1e-3


def test_chi_square_detects_a_broken_sampler():
    """Power: a sampler that draws the correction from p instead of the residual is rejected."""
    gen = torch.Generator().manual_seed(0)
    q, p = random_dist(gen, 1), random_dist(gen, 2)
    sampler = make_generator(0)
    counts = [0] * V
    for _ in range(TRIALS):
        d = sample_from_probs(q[0], sampler)
        accept = torch.rand((), generator=sampler) < min(1.0, float(p[0, d] / q[0, d]))
        counts[d if accept else sample_from_probs(p[0], sampler)] += 1
    assert chi_square_pvalue(counts, p[0].tolist()) < 1e-3


def test_greedy_verify_cases():
    argmax = torch.tensor([5, 6, 7, 8])
    assert greedy_verify([5, 6, 7], argmax) == (3, 8)  # all accepted + bonus
    assert greedy_verify([1, 6, 7], argmax) == (0, 5)  # first rejected → target's token
    assert greedy_verify([5, 6, 0], argmax) == (2, 7)  # mid rejection
    assert greedy_verify([], argmax[:1]) == (0, 5)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8, top_k=3), SamplingParams(temperature=1.0, top_p=0.7)])
def test_truncated_sampling_through_verify(params):
    """top-k/top-p applied to both sides via the shared transform: output ~ transformed p, never outside its support."""
    gen = torch.Generator().manual_seed(4)
    target_logits, draft_logits = torch.randn(3, V, generator=gen) * 2, torch.randn(2, V, generator=gen) * 2
    p, q = logits_to_probs(target_logits, params), logits_to_probs(draft_logits, params)
    sampler = make_generator(2)
    counts = [0] * V
    for _ in range(TRIALS):
        tokens = [sample_from_probs(q[i], sampler) for i in range(2)]
        n_acc, nxt = verify(tokens, q, target_logits, params, sampler)
        counts[tokens[0] if n_acc else nxt] += 1
    support = (p[0] > 0).tolist()
    assert all(c == 0 for c, s in zip(counts, support) if not s)
    assert chi_square_pvalue(counts, p[0].tolist()) > 1e-3
