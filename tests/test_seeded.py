"""Seeded sampling that speculation cannot change (specdec/seeded.py): a seeded request's text is plain
decoding's with that seed for every drafter, γ, tree setting and load, and each token is an exact
sample of the target's distribution — χ² tests over seeds, with a broken variant shown failing."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.certify import distribution_check
from specdec.config import SpecConfig
from specdec.sampling import SamplingParams
from specdec.seeded import position_key, race_times, seeded_choice, seeded_verify
from specdec.stats_tests import chi_square_pvalue

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\ndef fib"


def test_the_choice_at_a_position_is_a_sample_of_p_and_positions_are_independent():
    """Over seeds, the token at one position follows p, and the pair at two positions follows p ⊗ p';
    clocks shared by every position (the key without the position) give the same token at both where
    p = p' — the joint test catches it."""
    p = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1, 0.0])
    other = torch.tensor([0.3, 0.1, 0.2, 0.15, 0.25, 0.0])
    seeds = range(6000)
    firsts = [seeded_choice(p, seed, 10) for seed in seeds]
    counts = [firsts.count(token) for token in range(5)]
    assert counts[-1] > 0 and 5 not in firsts  # a token of probability 0 never
    assert chi_square_pvalue(counts, (p[:5] / p.sum()).tolist()) > 1e-3
    joint = {}
    for seed, first in zip(seeds, firsts):
        pair = (first, seeded_choice(other, seed, 11))
        joint[pair] = joint.get(pair, 0) + 1
    cells = [(a, b) for a in range(5) for b in range(5)]
    product = [float(p[a] * other[b]) for a, b in cells]
    assert chi_square_pvalue([joint.get(cell, 0) for cell in cells], product) > 1e-3

    def shared(probs: torch.Tensor, seed: int) -> int:  # the broken variant: one set of clocks per seed
        return int((probs / race_times(seed, 0, probs.shape[0])).argmax())

    same = {}
    for seed in seeds:
        pair = (shared(p, seed), shared(p, seed))
        same[pair] = same.get(pair, 0) + 1
    assert chi_square_pvalue([same.get(cell, 0) for cell in cells], [float(p[a] * p[b]) for a, b in cells]) < 1e-6


def test_position_keys_never_repeat_within_a_request_and_clocks_share_a_prefix():
    assert len({position_key(7, position) for position in range(100_000)}) == 100_000
    assert position_key(7, 5) != position_key(8, 5)
    assert torch.equal(race_times(3, 4, 1000)[:300], race_times(3, 4, 300))  # a reduced draft vocabulary reads the same clocks


def test_verification_accepts_exactly_the_targets_own_choices():
    params = SamplingParams(temperature=1.0, seed=5)
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    choices = [seeded_choice(torch.softmax(logits[row], -1), 5, 20 + row) for row in range(4)]
    assert seeded_verify(choices[:3], logits, params, 20) == (3, choices[3])  # all accepted, then the bonus
    wrong = (choices[1] + 1) % 50
    assert seeded_verify([choices[0], wrong, choices[2]], logits, params, 20) == (1, choices[1])
    assert seeded_verify([], logits[:1], params, 20) == (0, choices[0])  # plain decoding's step


SPECS = [
    pytest.param(SpecConfig(method="draft_model", num_speculative_tokens=1), id="draft_model-1"),
    pytest.param(SpecConfig(method="draft_model", num_speculative_tokens=3, spec_tree="off"), id="draft_model-3"),
    pytest.param(SpecConfig(method="draft_model", num_speculative_tokens=4, spec_tree="auto"), id="draft_model-tree"),
    pytest.param(SpecConfig(method="draft_model", num_speculative_tokens="auto"), id="draft_model-auto"),
    pytest.param(SpecConfig(method="draft_suffix", num_speculative_tokens="auto"), id="draft_suffix-auto"),
    pytest.param(SpecConfig(method="suffix", num_speculative_tokens=6, spec_tree="auto"), id="suffix-tree"),
    pytest.param(SpecConfig(method="ngram", num_speculative_tokens=4), id="ngram"),
    pytest.param(SpecConfig(method="layer_skip", num_speculative_tokens=3, skip_layers=[1]), id="layer_skip"),
]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("sampling", [dict(temperature=0.9), dict(temperature=0.7, top_p=0.9, top_k=20),
                                      dict(temperature=1.2, repetition_penalty=1.3)], ids=["t0.9", "top-p-k", "penalty"])
def test_a_seeded_request_is_plain_decodings_text_whatever_drafts(tiny_target, tiny_draft, spec, sampling):
    """Rejection sampling spent its draws per round, so a seed's text followed γ=auto's timings, the
    shared suffix table and the load (a server answered one seeded request three ways); now every
    method and γ gives plain decoding's text token for token, seed by seed."""
    draft = tiny_draft if spec.method in ("draft_model", "draft_suffix") else None
    proposed = 0
    for seed in range(4):
        params = SamplingParams(max_tokens=24, seed=seed, ignore_eos=True, **sampling)
        plain = specdec.generate(tiny_target, PROMPT, params)
        fast = specdec.generate(tiny_target, PROMPT, params, draft=draft, spec=spec)
        assert fast.token_ids == plain.token_ids, seed
        proposed += fast.stats.proposed_tokens
    assert proposed > 0  # it speculated


def test_a_seeded_draft_that_is_the_target_is_always_accepted(tiny_target):
    """The draft reads the clocks the target's choice reads: a draft with the target's distribution
    proposes the target's choice every time (α 1; drawing on its own it would match Σ p² of the time)."""
    params = SamplingParams(temperature=1.0, max_tokens=30, seed=11, ignore_eos=True)
    out = specdec.generate(tiny_target, PROMPT, params, draft=tiny_target,
                           spec=SpecConfig(method="draft_model", num_speculative_tokens=4, spec_tree="off"))
    assert out.stats.proposed_tokens > 0 and out.stats.accepted_tokens == out.stats.proposed_tokens


@pytest.mark.parametrize("method", ["draft_model", "suffix"])
def test_the_seeded_configuration_passes_the_certificate(method):
    """specdec verify's χ² check over seeds (sample i seeded i): the joint of the first tokens is the
    target's, drafts both accepted and refused."""
    result = distribution_check(method, "T=1,seeded", SamplingParams(temperature=1.0, seed=0), samples=1500)
    assert result.passed, result.detail
