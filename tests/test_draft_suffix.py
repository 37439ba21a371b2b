"""Suffix-assisted draft-model drafting (method ``draft_suffix``): exact output, the table drafting
where it is trusted, the draft model elsewhere, and the mid-round take-over."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.api import encode_prompt, make_drafter
from specdec.config import SpecConfig
from specdec.calls import run_now
from specdec.drafters.model_steps import draft_steps
from specdec.drafters.suffix import clear_global_caches
from specdec.engine import generate_ids
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams, make_generator

PROMPTS = [
    "def fibonacci(n):",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "a a a a a a a a a a a a",
]


def run_hybrid(target, draft, prompt: str, params: SamplingParams, gamma: int | str, trust: float | None = None):  # noqa: ANN001
    spec = SpecConfig(method="draft_suffix", num_speculative_tokens=gamma)
    ids = encode_prompt(target, prompt)
    generator = make_generator(params.seed)
    drafter = make_drafter(target, spec, params, generator, len(ids) + params.max_tokens + spec.max_speculative_tokens + 1, draft)
    if trust is not None:
        drafter.suffix_trust = trust
    out = generate_ids(target.backend, ids, params, drafter, spec, target.tokenizer, generator)
    return out, drafter


@pytest.mark.parametrize("gamma", [1, 3, 6, "auto"])
@pytest.mark.parametrize("draft_kind", ["other", "same"])
def test_greedy_draft_suffix_equals_plain(tiny_target, tiny_draft, gamma, draft_kind):
    """Exact output whichever source drafts: with the default trust (mostly the draft model) and
    with trust 0 (the table drafts every round it has any match for, and takes over mid-round)."""
    draft = tiny_draft if draft_kind == "other" else tiny_target
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    for trust in (None, 0.0):
        clear_global_caches()
        rounds = {"suffix": 0, "draft": 0}
        for prompt in PROMPTS:
            out, drafter = run_hybrid(tiny_target, draft, prompt, params, gamma, trust)
            assert out.token_ids == specdec.generate(tiny_target, prompt, params).token_ids, (prompt, gamma, trust)
            assert out.stats.draft_forwards == drafter.model_forwards  # GB/s counts draft steps, not table tokens
            rounds["suffix"] += drafter.suffix_rounds
            rounds["draft"] += drafter.draft_rounds
        assert rounds["suffix" if trust == 0.0 else "draft"] > 0, rounds


def test_trusted_table_drafts_past_the_rounds_gamma_and_skips_the_draft_model(tiny_target, tiny_draft):
    """A trusted suffix proposal is used as it is (no draft-model step), up to the request's γ
    maximum even when the controller asked for fewer tokens; an untrusted one goes to the draft model."""
    clear_global_caches()
    params = SamplingParams(temperature=0.0, max_tokens=16)
    spec = SpecConfig(method="draft_suffix", num_speculative_tokens=6, spec_tree="off")  # the draft model's chain
    drafter = make_drafter(tiny_target, spec, params, make_generator(0), 200, tiny_draft)
    steps: list[list[int]] = []
    forward = drafter.draft.backend.forward
    drafter.draft.backend = type("Spy", (), {"config": tiny_draft.backend.config,
                                             "prompt_backend": property(lambda self: self),  # prompt passes here too
                                             "prefix_cache": None,
                                             "forward": lambda self, state, tokens, **kw: steps.append(tokens) or forward(state, tokens, **kw)})()
    repeated = [7, 8, 9, 10, 11, 12, 13, 14] * 3
    drafter.start(repeated)
    draft = drafter.propose(repeated, 2)
    assert draft.tokens == [7, 8, 9, 10, 11, 12] and draft.prefix_accept is not None
    assert steps == [] and drafter.suffix_rounds == 1
    drafter.accepted(6, 13)

    fresh = repeated + [7, 8, 9, 10, 11, 12, 13, 99]  # 99 was never seen: no match to trust
    draft = drafter.propose(fresh, 2)
    assert len(draft.tokens) == 2 and draft.prefix_accept is None
    assert steps and steps[0] == fresh  # the draft model caught up on everything it had not seen
    assert drafter.draft_rounds == 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_take_over_ends_the_round_with_point_masses(temperature):
    """draft_steps asks take_over before each further step; the tokens it returns end
    the round without a step, and under sampling get one-hot q rows (the point-mass rule)."""
    logits = torch.full((10,), -20.0)
    logits[4] = 20.0
    steps: list[int] = []
    asked: list[tuple[list[int], int]] = []

    def step(token: int):  # a step whose forward needs no model: yields no call
        steps.append(token)
        return logits
        yield  # noqa: unreachable - makes this a generator

    def take_over(drafted: list[int], room: int) -> list[int]:
        asked.append((list(drafted), room))
        return [6, 7] if len(drafted) == 2 else []

    params = SamplingParams(temperature=temperature)
    draft = run_now(draft_steps(logits, step, 6, params, make_generator(0), take_over=take_over))
    assert draft.tokens == [4, 4, 6, 7]
    assert steps == [4]  # one step (after the first token); none for the table's tokens
    assert asked == [([4], 5), ([4, 4], 4)]
    if temperature == 0:
        assert draft.probs is None
    else:
        assert draft.probs.shape == (4, 10)
        assert torch.equal(draft.probs[2], torch.nn.functional.one_hot(torch.tensor(6), 10).float())
        assert torch.equal(draft.probs[3], torch.nn.functional.one_hot(torch.tensor(7), 10).float())


def test_sampling_draft_suffix_is_reproducible(tiny_target, tiny_draft):
    params = SamplingParams(temperature=0.9, max_tokens=24, seed=7, ignore_eos=True)
    clear_global_caches()
    a, _ = run_hybrid(tiny_target, tiny_draft, PROMPTS[2], params, 4)
    clear_global_caches()
    b, _ = run_hybrid(tiny_target, tiny_draft, PROMPTS[2], params, 4)
    assert a.token_ids == b.token_ids


def test_draft_suffix_without_draft_model_is_a_clear_error(tiny_target):
    with pytest.raises(SpecdecError, match="'draft_suffix' needs a draft model"):
        specdec.generate(tiny_target, "hi", SamplingParams(max_tokens=4), spec=SpecConfig(method="draft_suffix"))


@pytest.mark.parametrize("config", ["T=1", "T=0.7,top-k=4"])
def test_mixed_rounds_keep_the_target_distribution(monkeypatch, config):
    """With trust 0 the table drafts or finishes nearly every round: model tokens (q) and table
    tokens (point masses) share rounds, and the output distribution must still be the target's."""
    import specdec.drafters.draft_suffix as draft_suffix
    from specdec.certify import DISTRIBUTION_CONFIGS, distribution_check

    monkeypatch.setattr(draft_suffix, "DEFAULT_SUFFIX_TRUST", 0.0)
    taken: list[int] = []
    take_over = draft_suffix.SuffixAssistedDrafter._take_over

    def counting(self, drafted, room):  # noqa: ANN001
        tokens = take_over(self, drafted, room)
        taken.append(len(tokens))
        return tokens

    monkeypatch.setattr(draft_suffix.SuffixAssistedDrafter, "_take_over", counting)
    clear_global_caches()
    # the common prompt, where the table has no proposal after some first tokens: the draft model drafts there and
    # the table takes over mid-round (after TABLE_PROMPT, at trust 0, the table drafted every round alone)
    result = distribution_check("draft_suffix", config, DISTRIBUTION_CONFIGS[config], samples=2500, gamma=3, length=4,
                                prompt=[1, 2, 3, 1, 2, 3, 1, 2])
    assert result.passed, result.detail
    assert any(taken), "no round mixed model and table tokens"


def test_a_less_sure_copy_is_verified_where_it_promises_more_than_the_draft_model():
    """The table's proposal below the trust threshold replaced the draft model nowhere: on summaries (draft α ~0.55)
    ``suffix`` alone ran 1.62x plain and draft_suffix 1.32x. Now a copy wins where its expected committed tokens per
    second beat the draft model's k tokens at its α in this request — planned optimistically until judged — and
    always where γ=auto gives the draft model k = 0."""
    from types import SimpleNamespace

    from specdec.adaptive import VerifyCosts
    from specdec.drafters.base import Draft
    from specdec.drafters.draft_suffix import SuffixAssistedDrafter
    from specdec.drafters.suffix import SuffixDrafter

    model = SimpleNamespace(step_seconds=0.2, take_over=None, accepted=lambda accepted, token: None)
    flat = VerifyCosts({k: 1.0 for k in range(9)})
    drafter = SuffixAssistedDrafter(model, SuffixDrafter(), verify_costs=flat)  # type: ignore[arg-type]
    weak, fair = Draft(tokens=[7], prefix_accept=[0.3]), Draft(tokens=[7, 8], prefix_accept=[0.45, 0.3])
    assert drafter._copy_pays(weak, 0) and drafter._copy_pays(fair, 0)  # the draft model sits out: the copy is free
    steep = SuffixAssistedDrafter(model, SuffixDrafter(), verify_costs=VerifyCosts({0: 1.0, 1: 2.0}))  # type: ignore[arg-type]
    assert not steep._copy_pays(weak, 0)  # ... unless verifying it costs more than it brings: a plain step then
    assert not drafter._copy_pays(fair, 4)  # unjudged, the draft model is planned at α 0.9: 4.1 tokens for 1.8 steps
    for _ in range(4):  # the draft model judged: 2 of 4 tokens accepted a round (3 trials each): α 0.5
        drafter._last, drafter._model_proposed = drafter.draft, 4
        drafter.accepted(2, 0)
    assert (drafter._model_accepted, drafter._model_trials) == (8, 12)
    assert drafter._copy_pays(fair, 4)  # 1.75 tokens for 1.2 steps against 1.94 for 1.8
    assert not drafter._copy_pays(weak, 2)  # 1.3 tokens for 1.2 steps against 1.75 for 1.4
    assert not drafter._copy_pays(Draft(tokens=[7, 8], prefix_accept=[0.45, 0.3], parents=[-1, 0]), 4)  # trees: as before
    unmeasured = SuffixAssistedDrafter(model, SuffixDrafter())  # type: ignore[arg-type]
    assert unmeasured._copy_pays(fair, 0) and not unmeasured._copy_pays(fair, 4)  # no costs: only the trust threshold
