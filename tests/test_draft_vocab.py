"""Reduced draft vocabulary (--draft-vocab-size): a cheaper draft head, the same output."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.certify import DISTRIBUTION_CONFIGS, distribution_check
from specdec.config import SpecConfig
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
PROMPTS = ["def fibonacci(n):", "The quick brown fox jumps over the lazy dog. The quick"]


@pytest.mark.parametrize("spec", [
    SpecConfig(method="draft_model", num_speculative_tokens=4, draft_vocab_size=200),
    SpecConfig(method="early_exit", num_speculative_tokens=3, exit_layer=3, draft_vocab_size=100),
], ids=["draft-model", "early-exit"])
def test_greedy_identity(tiny_target, tiny_draft, spec):
    for prompt in PROMPTS:
        plain = specdec.generate(tiny_target, prompt, GREEDY)
        out = specdec.generate(tiny_target, prompt, GREEDY, draft=tiny_draft if spec.method == "draft_model" else None, spec=spec)
        assert out.token_ids == plain.token_ids
        assert out.stats.proposed_tokens > 0


def test_drafts_never_leave_the_reduced_vocabulary(tiny_target, tiny_draft):
    from specdec.api import make_drafter
    from specdec.sampling import make_generator

    params = SamplingParams(temperature=1.0, max_tokens=8, seed=0)
    drafter = make_drafter(tiny_target, SpecConfig(method="draft_model", draft_vocab_size=50), params, make_generator(0), 64, tiny_draft)
    ids = tiny_target.tokenizer.encode(PROMPTS[0])
    drafter.start(ids)
    for _ in range(10):
        draft = drafter.propose(ids, 4)
        assert all(t < 50 for t in draft.tokens)
        assert draft.probs.shape[-1] == tiny_draft.config.vocab_size
        assert float(draft.probs[:, 50:].sum()) == 0.0  # q is exactly zero outside: a valid proposal
        drafter.accepted(0, 1)


@pytest.mark.parametrize("method", ["draft_model", "early_exit"])
def test_sampling_distribution_is_the_targets(method):
    """χ² on the tiny 8-token model with the draft restricted to 5 ids: rejection sampling corrects q = 0."""
    config = "T=1"
    result = distribution_check(method, config, DISTRIBUTION_CONFIGS[config], samples=2500,
                                spec_options={"draft_vocab_size": 5})
    assert result.passed, result.detail


def test_int8_head_rows_equal_the_full_heads_first_rows(tiny_dirs):
    model = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="int8")
    decoder = model.backend.decoder
    hidden = torch.randn(3, model.config.hidden_size)
    assert torch.equal(decoder.head_rows(100)(hidden), decoder.lm_head(hidden)[:, :100])


def test_negative_size_is_refused():
    with pytest.raises(SpecdecError, match="draft_vocab_size"):
        SpecConfig(method="draft_model", draft_vocab_size=-1)


def test_the_draft_step_prior_is_the_reduced_heads(tiny_draft, monkeypatch):
    """γ=auto's prior for a draft step reads the curve measured for the reduced vocabulary (the
    whole head's step overstated a 0.5B draft's by half, and auto declined to draft where it paid)."""
    from specdec.drafters.draft_model import DraftModelDrafter
    from specdec.sampling import make_generator

    seen = []

    def cached(cfg, mode):  # noqa: ANN001, ANN202
        seen.append(cfg.vocab_size)
        return {1: 0.004, 2: 0.005} if cfg.vocab_size == 128 else None

    monkeypatch.setattr("specdec.step_costs.full_curve", cached)
    monkeypatch.setattr(tiny_draft.backend, "step_seconds", {1: 0.010, 2: 0.011})
    params = SamplingParams(temperature=0)
    reduced = DraftModelDrafter(tiny_draft.backend, params, make_generator(0), 64, vocab_limit=128)
    assert reduced.step_seconds == 0.004 and seen == [128]
    assert DraftModelDrafter(tiny_draft.backend, params, make_generator(0), 64).step_seconds == 0.010
    monkeypatch.setattr("specdec.step_costs.full_curve", lambda cfg, mode: None)
    assert reduced.step_seconds == 0.010  # never measured for that head: the whole head's, an upper bound
    # a fresh machine: --quantize auto timed only the reduced head; that is the prior, not "unknown"
    monkeypatch.setattr("specdec.step_costs.full_curve", cached)
    monkeypatch.setattr(tiny_draft.backend, "step_seconds", None)
    assert reduced.step_seconds == 0.004


@pytest.mark.parametrize("method", ["draft_model", "draft_suffix", "early_exit"])
def test_penalties_naming_ids_past_the_draft_rows_leave_the_output_exact(tiny_target, tiny_draft, method):
    """``min_tokens`` bans the stop ids and ``logit_bias`` shifts ids the reduced draft head has no row for: the
    real 0.5B draft's 65536-id rows were indexed with EOS 151643 and raised IndexError (a server's 500)."""
    params = SamplingParams(temperature=0.0, max_tokens=24, min_tokens=12, stop_token_ids=[300], logit_bias={400: 4.0, 7: 2.0})
    spec = SpecConfig(method=method, num_speculative_tokens=3, draft_vocab_size=200,
                      **({"exit_layer": 3} if method == "early_exit" else {}))
    for prompt in PROMPTS:
        plain = specdec.generate(tiny_target, prompt, params)
        out = specdec.generate(tiny_target, prompt, params, draft=tiny_draft if method != "early_exit" else None, spec=spec)
        assert out.token_ids == plain.token_ids
        assert out.stats.proposed_tokens > 0
