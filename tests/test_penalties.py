"""Logit bias and repetition / frequency / presence penalties: the reference definitions, one history
per verified row, greedy identity with plain decoding for every drafter kind, and clear errors.
(The sampled distribution is certified in tests/test_certify.py: its "T=1,penalties" configuration.)"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.penalties import Penalties
from specdec.sampling import SamplingParams

PENALISED = dict(repetition_penalty=1.3, frequency_penalty=0.6, presence_penalty=0.4)
PROMPTS = ["def fibonacci(n):", "for i in range(10):"]


def test_repetition_penalty_is_transformers_definition():
    """Against HF's RepetitionPenaltyLogitsProcessor over prompt + output (the reference implementation)."""
    from transformers import RepetitionPenaltyLogitsProcessor

    torch.manual_seed(0)
    logits = torch.randn(50) * 3
    prompt, output = [1, 4, 4, 9], [9, 12, 30, 12]
    ours = Penalties(SamplingParams(repetition_penalty=1.7), prompt, 50).apply(logits, output)
    theirs = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([prompt + output]), logits.clone()[None])[0]
    assert torch.equal(ours, theirs)


def test_frequency_presence_and_bias_follow_openai():
    """logit − frequency × count − presence × [count > 0] over the output only, plus the bias."""
    torch.manual_seed(1)
    logits = torch.randn(40)
    prompt, output = [3, 3, 7], [5, 5, 5, 8]
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, logit_bias={2: -3.0, 5: 1.0})
    ours = Penalties(params, prompt, 40).apply(logits, output)
    expected = logits.clone()
    expected[2] -= 3.0
    expected[5] += 1.0
    expected[5] -= 0.25 * 3 + 0.5
    expected[8] -= 0.25 * 1 + 0.5
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)
    assert torch.equal(ours[[3, 7]], logits[[3, 7]])  # prompt tokens: only the repetition penalty reads them


def test_each_verified_row_gets_its_own_history_bit_for_bit():
    """Row i of a chunk after the output and drafted[:i] — the same bits as that row alone."""
    torch.manual_seed(2)
    params = SamplingParams(presence_penalty=0.3, frequency_penalty=0.7, repetition_penalty=1.4, logit_bias={1: 2.0},
                            min_tokens=5)
    penalties = Penalties(params, [1, 2, 3], 64, stop_ids=[9])
    chunk = torch.randn(4, 64)
    output, drafted = [5, 6, 5], [7, 5, 7]
    together = penalties.apply(chunk, output, drafted)
    for i in range(4):
        alone = penalties.apply(chunk[i], output + drafted[:i])
        assert torch.equal(together[i], alone)
    assert not torch.equal(together[1], penalties.apply(chunk[1], output))  # the drafted token counts
    assert [bool(together[i, 9].isinf()) for i in range(4)] == [True, True, False, False]  # min_tokens: 5 by row 2


def test_tree_rows_are_penalised_after_their_own_paths():
    """Token trees: node i's row follows its ancestors' tokens and its own, not its siblings'."""
    torch.manual_seed(3)
    penalties = Penalties(SamplingParams(frequency_penalty=0.9, presence_penalty=0.3, repetition_penalty=1.5), [4], 32)
    tokens, parents = [5, 6, 7, 5], [-1, -1, 0, 2]  # 5 -> 7 -> 5, and a sibling 6 of the first 5
    rows = torch.randn(5, 32)
    tree = penalties.apply_tree(rows, [9], tokens, parents)
    for i, path in enumerate([[], [5], [6], [5, 7], [5, 7, 5]]):
        assert torch.equal(tree[i], penalties.apply(rows[i], [9] + path))


@pytest.mark.parametrize("method", ["draft_model", "draft_suffix"])
def test_greedy_trees_with_penalties_are_token_identical(tiny_target, method):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, **PENALISED)
    spec = specdec.SpecConfig(method=method, num_speculative_tokens=3, spec_tree=6)
    for prompt in PROMPTS:
        plain = specdec.generate(tiny_target, prompt, params)
        out = specdec.generate(tiny_target, prompt, params, draft=tiny_target, spec=spec)
        assert out.token_ids == plain.token_ids and out.stats.tree_rounds > 0


def test_sampled_trees_with_penalties_pass_the_certificate():
    from specdec.certify import DISTRIBUTION_CONFIGS, distribution_check

    result = distribution_check("draft_model", "T=1,penalties", DISTRIBUTION_CONFIGS["T=1,penalties"], samples=2500,
                                spec_options={"spec_tree": 6})
    assert result.passed, result.detail


def test_min_tokens_holds_back_the_end_and_speculation_keeps_it_exact(tiny_target, tiny_draft):
    """A stop token the output reaches early: min_tokens pushes the end past the bound under plain
    decoding and every drafter alike."""
    stop = specdec.generate(tiny_target, PROMPTS[1], SamplingParams(temperature=0, max_tokens=8)).token_ids[2]
    free = specdec.generate(tiny_target, PROMPTS[1], SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop]))
    assert free.finish_reason == "stop" and len(free.token_ids) == 3 and free.token_ids[-1] == stop  # kept, as vLLM
    params = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop], min_tokens=20)
    plain = specdec.generate(tiny_target, PROMPTS[1], params)
    assert len(plain.token_ids) >= 20 and stop not in plain.token_ids[:20]
    for method in ("draft_model", "draft_suffix", "ngram"):
        out = specdec.generate(tiny_target, PROMPTS[1], params, draft=tiny_draft,
                               spec=specdec.SpecConfig(method=method, num_speculative_tokens=4))
        assert out.token_ids == plain.token_ids and out.finish_reason == plain.finish_reason


def test_min_tokens_yields_where_only_a_stop_token_is_allowed():
    """A completed grammar allows only the stop tokens: banning them left every logit -inf, argmax took token 0 (the
    real vocabulary's "!") and the grammar refused it. There the stop token ends the output; elsewhere it is banned."""
    penalties = Penalties(SamplingParams(min_tokens=5), [1, 2], vocab_size=8, stop_ids=[7])
    only_stop = torch.full((8,), float("-inf"))
    only_stop[7] = 1.5
    assert penalties.apply(only_stop, [3])[7] == 1.5
    some_text = only_stop.clone()
    some_text[4] = -3.0
    row = penalties.apply(some_text, [3])
    assert row[7] == float("-inf") and row[4] == -3.0
    assert penalties.apply(some_text, [3, 3, 3, 3, 3])[7] == 1.5  # min_tokens reached


def test_a_draft_bans_the_stop_tokens_min_tokens_bans(tiny_target):
    """min_tokens bans the request's stop tokens from the target's rows; a model drafter bans them
    from its own (it is told the stop ids), so the target as its own draft never proposes the stop
    token it would reject: every drafted token is accepted (without the ids the draft proposed the
    stop token at each early position that wants it, and those rounds were rejected there)."""
    stop = specdec.generate(tiny_target, PROMPTS[1], SamplingParams(temperature=0, max_tokens=8)).token_ids[2]
    params = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop], min_tokens=30)
    plain = specdec.generate(tiny_target, PROMPTS[1], params)
    for method in ("draft_model", "layer_skip"):
        options = {"skip_layers": []} if method == "layer_skip" else {}
        spec = specdec.SpecConfig(method=method, num_speculative_tokens=4, spec_tree="off", **options)
        out = specdec.generate(tiny_target, PROMPTS[1], params, draft=tiny_target, spec=spec)
        assert out.token_ids == plain.token_ids
        assert out.stats.accepted_tokens == out.stats.proposed_tokens > 20, method


def test_stop_strings_wait_for_min_tokens(tiny_target):
    """As vLLM: no stop string ends the output before min_tokens tokens either."""
    text = specdec.generate(tiny_target, PROMPTS[1], SamplingParams(temperature=0, max_tokens=8)).text
    early = SamplingParams(temperature=0, max_tokens=30, stop=[text[:3]])
    assert specdec.generate(tiny_target, PROMPTS[1], early).text == ""
    held = specdec.generate(tiny_target, PROMPTS[1], SamplingParams(temperature=0, max_tokens=30, stop=[text[:3]], min_tokens=12))
    assert len(held.token_ids) >= 12 and held.text.startswith(text[:3])


@pytest.mark.parametrize("method", ["draft_model", "ngram", "suffix", "draft_suffix", "layer_skip"])
def test_greedy_with_penalties_is_token_identical_to_plain(tiny_target, tiny_draft, method):
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, logit_bias={7: -100.0}, **PENALISED)
    spec = specdec.SpecConfig(method=method, num_speculative_tokens=4)
    for prompt in PROMPTS:
        plain = specdec.generate(tiny_target, prompt, params)
        out = specdec.generate(tiny_target, prompt, params, draft=tiny_draft, spec=spec)
        assert out.token_ids == plain.token_ids, (method, prompt)
        assert 7 not in plain.token_ids
        unpenalised = specdec.generate(tiny_target, prompt, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
        assert unpenalised.token_ids != plain.token_ids  # the penalties changed the text: the identity is not vacuous


def test_a_draft_that_agrees_fills_whole_chunks_and_stays_identical(tiny_target):
    """The target as its own draft (the same penalties on q): every drafted token is accepted, so
    every row of every chunk after the first reads drafted tokens in its history."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, **PENALISED)
    spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=4, spec_tree="off")
    plain = specdec.generate(tiny_target, PROMPTS[0], params)
    out = specdec.generate(tiny_target, PROMPTS[0], params, draft=tiny_target, spec=spec)
    assert out.token_ids == plain.token_ids
    assert out.stats.accepted_tokens == out.stats.proposed_tokens > 20


def test_a_draft_that_agrees_grows_trees_whose_first_choices_are_accepted(tiny_target):
    """Trees too rank each node after its own path, penalised: with the target as its own draft the
    accepted path runs through every first choice (ranked unpenalised, rounds left it at a second
    choice or at nothing: 4 such rounds of 21 on the first prompt)."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, **PENALISED)
    spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=4, spec_tree=6)
    for prompt in PROMPTS:
        out = specdec.generate(tiny_target, prompt, params, draft=tiny_target, spec=spec)
        trees = [r.first_choices for r in out.stats.rounds if r.first_choices is not None]
        assert len(trees) > 10 and all(accepted == depth for depth, accepted in trees), trees


def committed_only(self, logits, output_ids, drafted=()):  # noqa: ANN001, ANN202
    """A wrong rule: every row of a verification chunk penalised after the committed tokens only."""
    if logits.dim() == 1:
        return ORIGINAL_APPLY(self, logits, output_ids, drafted)
    return torch.stack([ORIGINAL_APPLY(self, row, output_ids) for row in logits])


ORIGINAL_APPLY = Penalties.apply


def test_rows_penalised_without_their_drafted_tokens_break_identity(tiny_target, monkeypatch):
    """The test above has the power to fail (a penalised token must be the row's contender to
    matter, so across the prompts, not on each)."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, **PENALISED)
    plain = [specdec.generate(tiny_target, prompt, params).token_ids for prompt in PROMPTS]
    monkeypatch.setattr(Penalties, "apply", committed_only)
    spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=4, spec_tree="off")
    wrong = [specdec.generate(tiny_target, prompt, params, draft=tiny_target, spec=spec).token_ids for prompt in PROMPTS]
    assert wrong != plain


def test_a_wrong_history_fails_the_sampling_certificate(monkeypatch):
    from specdec.certify import DISTRIBUTION_CONFIGS, distribution_check

    monkeypatch.setattr(Penalties, "apply", committed_only)
    result = distribution_check("draft_model", "T=1,penalties", DISTRIBUTION_CONFIGS["T=1,penalties"], samples=2500)
    assert not result.passed, result.detail


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(presence_penalty=2.5), "presence_penalty must be a number in [-2, 2]"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be a finite number > 0"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty"),
    (dict(logit_bias={-1: 1.0}), "logit_bias keys must be token ids"),
    (dict(logit_bias={3: 101.0}), "logit_bias values must be numbers in [-100, 100]"),
    (dict(logit_bias=[1, 2]), "logit_bias must map token ids to numbers"),
    (dict(min_tokens=20, max_tokens=10), "min_tokens must be an integer in [0, max_tokens = 10]"),
    (dict(min_tokens=-1), "min_tokens"),
])
def test_bad_values_are_clear_errors(kwargs, fragment):
    with pytest.raises(SpecdecError) as raised:
        SamplingParams(**kwargs)
    assert fragment in str(raised.value)


def test_a_bias_outside_the_vocabulary_is_refused_before_generating(tiny_target):
    vocab = tiny_target.config.vocab_size
    with pytest.raises(SpecdecError, match="outside the vocabulary"):
        specdec.generate(tiny_target, "x", SamplingParams(max_tokens=4, logit_bias={vocab + 3: 1.0}))


def test_cli_generate_takes_the_penalty_flags(tiny_dirs, capsys):
    args = ["generate", PROMPTS[1], "--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]), "--dtype",
            "float32", "--quantize", "none", "--max-tokens", "12", "--ignore-eos", "--num-speculative-tokens", "3",
            "--repetition-penalty", "1.3", "--frequency-penalty", "0.6", "--presence-penalty", "0.4"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    expected = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu")
    text = specdec.generate(expected, PROMPTS[1], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **PENALISED)).text
    assert text in printed
    assert main(args[:-6] + ["--presence-penalty", "3"]) != 0
    assert "presence_penalty must be a number in [-2, 2]" in capsys.readouterr().err
