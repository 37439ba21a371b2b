"""Exactness of the speculative loop: greedy output == plain decoding, caches in step, stops exact."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.api import make_drafter
from specdec.config import DEFAULT_DRAFT_METHOD, DEFAULT_SUFFIX_CACHE_ENTRIES, SpecConfig
from specdec.drafters.base import Drafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.engine import generate_ids
from specdec.errors import ContextLengthError, DrafterError, SpecdecError
from specdec.sampling import SamplingParams, make_generator

PROMPTS = [
    "def fibonacci(n):",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "a a a a a a a a a a a a",
    "café 你好 🙂 and more",
]


def run(target, prompt_ids, params, draft=None, gamma=4, drafter_cls=None, tree="off"):
    """Chains by default (``tree``: spec_tree): these tests pin chain rounds; test_tree.py the trees."""
    spec = SpecConfig(method="draft_model" if draft is not None else None, num_speculative_tokens=gamma, spec_tree=tree)
    gen = make_generator(params.seed)
    max_len = len(prompt_ids) + params.max_tokens + spec.max_speculative_tokens + 1
    drafter = make_drafter(target, spec, params, gen, max_len, draft)
    if drafter_cls is not None and drafter is not None:
        drafter.__class__ = drafter_cls
    return generate_ids(target.backend, prompt_ids, params, drafter, spec, target.tokenizer, gen)


@pytest.mark.parametrize("gamma", [1, 2, 3, 5, 8, "auto"])
@pytest.mark.parametrize("draft_kind", ["other", "same"])
@pytest.mark.parametrize("tree", ["off", "greedy"])  # chains, and the default's trees
def test_greedy_speculative_equals_plain(tiny_target, tiny_draft, gamma, draft_kind, tree):
    draft = tiny_draft if draft_kind == "other" else tiny_target
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for prompt in PROMPTS:
        ids = tiny_target.tokenizer.encode(prompt)
        plain = run(tiny_target, ids, params)
        spec = run(tiny_target, ids, params, draft, gamma, tree=tree)
        assert spec.token_ids == plain.token_ids, (prompt, gamma)
        assert spec.text == plain.text
        assert spec.finish_reason == plain.finish_reason == "length"
        assert len(spec.token_ids) == 40
        if draft_kind == "same" and gamma != "auto" and tree == "off":  # a tree's siblings are drafted too
            assert spec.stats.acceptance_rate == 1.0
        # every round commits at least one token, so speculation never costs extra target forwards;
        # a draft identical to the target is always accepted, so it saves some
        assert spec.stats.target_forwards <= plain.stats.target_forwards
        if draft_kind == "same":
            assert spec.stats.target_forwards < plain.stats.target_forwards


def test_unrelated_draft_has_low_acceptance_but_exact_output(tiny_target, tiny_draft):
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    ids = tiny_target.tokenizer.encode(PROMPTS[0])
    out = run(tiny_target, ids, params, tiny_draft, 4)
    assert out.stats.acceptance_rate < 0.5
    assert out.token_ids == run(tiny_target, ids, params).token_ids


@pytest.mark.parametrize("gamma", [2, 5])
def test_stop_token_inside_accepted_block(tiny_target, gamma):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ids = tiny_target.tokenizer.encode(PROMPTS[1])
    reference = run(tiny_target, ids, params).token_ids
    for cut in (3, 7, 12):
        stop_params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop_token_ids=[reference[cut]])
        plain = run(tiny_target, ids, stop_params)
        spec = run(tiny_target, ids, stop_params, tiny_target, gamma)  # full acceptance: the stop lands mid-block
        assert plain.finish_reason == spec.finish_reason == "stop"
        # the stop token is output, as vLLM outputs stop_token_ids (the model's end of sequence is not)
        assert spec.token_ids == plain.token_ids == reference[: reference.index(reference[cut]) + 1]
        # τ counts the stop token its forward committed: plain decoding is exactly 1 (it read 0.94 when
        # the stop's forward counted and the token did not); full acceptance, at least 1
        assert plain.stats.mean_accepted_len == 1.0 and spec.stats.mean_accepted_len >= 1.0
        # what followed the stop in its block is neither output nor counted: accepted drafts and τ's
        # tokens are the output's decode tokens and the stop (a server answer of 6 tokens read 7
        # accepted and τ 8.0)
        decoded = len(spec.token_ids) - 1  # after the prompt pass's token, the stop token (kept in the output) included
        assert spec.stats.committed_tokens == decoded and spec.stats.accepted_tokens <= decoded


def test_an_answer_of_the_prompt_pass_token_alone_reads_tau_1(tiny_target):
    """max_tokens 1: no decode forward ran; τ read 0.0 (below plain decoding's 1) in the stats and usage."""
    out = specdec.generate(tiny_target, PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=1), draft=tiny_target,
                           spec=SpecConfig(num_speculative_tokens=3))
    assert len(out.token_ids) == 1 and out.stats.target_forwards == 0 and out.stats.mean_accepted_len == 1.0


@pytest.mark.parametrize("gamma", [3, 6])
def test_stop_string_inside_accepted_block(tiny_target, gamma):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ids = tiny_target.tokenizer.encode(PROMPTS[0])
    full_text = run(tiny_target, ids, params).text
    stop = full_text[len(full_text) // 3 : len(full_text) // 3 + 3]
    assert stop, full_text
    stop_params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop])
    plain = run(tiny_target, ids, stop_params)
    spec = run(tiny_target, ids, stop_params, tiny_target, gamma)
    assert plain.text == spec.text == full_text[: full_text.index(stop)]
    assert plain.finish_reason == spec.finish_reason == "stop"


def test_streamed_text_equals_final_text(tiny_target):
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop=["zz"])
    chunks = list(specdec.stream(tiny_target, PROMPTS[3], params, draft=tiny_target))
    assert chunks[-1].stats is not None and chunks[-1].finish_reason is not None
    result = specdec.generate(tiny_target, PROMPTS[3], params, draft=tiny_target)
    assert "".join(c.text for c in chunks) == result.text
    assert [t for c in chunks for t in c.token_ids] == result.token_ids


class CheckedDrafter(DraftModelDrafter):
    """Asserts after every call that the draft cache holds exactly the tokens it should."""

    def propose_steps(self, context_ids, k):
        draft = yield from super().propose_steps(context_ids, k)
        expected = list(context_ids) + draft.tokens[:-1] if draft.tokens else list(context_ids)
        assert self.cached == expected[: len(self.cached)] and len(self.cached) >= len(context_ids)
        assert self.state.seq_len == len(self.cached)
        self._last = (list(context_ids), draft.tokens)
        return draft

    def accepted(self, num_accepted, next_token):
        super().accepted(num_accepted, next_token)
        context, tokens = self._last
        # the last proposed token was never fed to the draft, so a fully accepted round keeps k-1
        kept = len(context) + min(num_accepted, len(tokens) - 1)
        assert self.cached == (context + tokens[:num_accepted])[:kept]
        assert self.state.seq_len == kept


class SpyBackend:
    """Wraps a backend; checks the target cache has exactly the committed length before every step."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[int, list[int]]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, state, tokens, num_logits=None, tree=None, vocab_limit=None):
        self.calls.append((state.seq_len, list(tokens)))
        return self.inner.forward(state, tokens, num_logits=num_logits, tree=tree, vocab_limit=vocab_limit)


@pytest.mark.parametrize("draft_kind", ["other", "same"])
def test_caches_have_committed_length_after_every_step(tiny_target, tiny_draft, draft_kind):
    draft = tiny_draft if draft_kind == "other" else tiny_target
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    ids = tiny_target.tokenizer.encode(PROMPTS[1])
    spec = SpecConfig(method="draft_model", num_speculative_tokens=4, spec_tree="off")  # trees: test_tree.py
    gen = make_generator(0)
    drafter = make_drafter(tiny_target, spec, params, gen, 80, draft)
    drafter.__class__ = CheckedDrafter
    spy = SpyBackend(tiny_target.backend)
    out = generate_ids(spy, ids, params, drafter, spec, tiny_target.tokenizer, gen)
    full = ids + out.token_ids
    for seq_len, tokens in spy.calls[1:]:  # every decode step starts at the last committed token
        assert tokens[0] == full[seq_len]


@pytest.mark.parametrize("spec", [None, SpecConfig(method="draft_model"), SpecConfig(method="suffix"),
                                  SpecConfig(method="draft_model", num_speculative_tokens="auto"),
                                  SpecConfig(method="draft_suffix", num_speculative_tokens="auto")],
                         ids=["default", "draft_model", "suffix", "draft_model-auto", "draft_suffix-auto"])
def test_sampling_is_reproducible_with_seed(tiny_target, spec, monkeypatch):
    """The same seed gives the same text every run, though the rounds' lengths could follow timings
    (γ=auto, the suffix rounds' cost model) and the suffix cache earlier requests: here every run
    sees different clock readings, and each runs after the others added their outputs to the cache."""
    import itertools
    import random

    rng = random.Random(0)  # each reading 1 µs to 1 s after the last: costs no two runs agree on
    clock = itertools.accumulate(10 ** rng.uniform(-6, 0) for _ in itertools.count())
    monkeypatch.setattr("specdec.engine.time.perf_counter", lambda: next(clock))
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, seed=123, ignore_eos=True)
    specdec.reset_suffix_cache()  # (what earlier tests left there made the first run draft: alone it did not)
    # the target drafting for itself: every draft accepted, so γ=auto's choice follows the costs
    runs = [specdec.generate(tiny_target, PROMPTS[0], params, draft=tiny_target, spec=spec) for _ in range(3)]
    assert runs[-1].stats.proposed_tokens > 0  # it speculated (suffix: from the earlier runs' text)
    assert runs[1].token_ids == runs[0].token_ids and runs[2].token_ids == runs[0].token_ids


def test_prompt_longer_than_context_is_a_clear_error(tiny_target):
    long_ids = [5] * 600  # tiny context is 512
    with pytest.raises(ContextLengthError, match="context window"):
        specdec.generate(tiny_target, long_ids, SamplingParams(max_tokens=4))


def test_a_request_that_fills_the_context_speculates_as_plain_decoding_answers_it(tiny_target):
    """The draft's own context was checked against prompt + max_tokens + γ + 1, so the last γ + 1 tokens of the
    context refused a draft model plain decoding served (the engine never drafts past the context)."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompt = [5 + i % 50 for i in range(512 - 4)]  # tiny context is 512: prompt + max_tokens fill it
    plain = specdec.generate(tiny_target, prompt, params)
    for spec in (SpecConfig(method="draft_model", num_speculative_tokens=4), SpecConfig(method="draft_suffix")):
        assert specdec.generate(tiny_target, prompt, params, draft=tiny_target, spec=spec).token_ids == plain.token_ids


def test_the_library_refuses_wrong_types_with_a_message_not_a_deep_error(tiny_target):
    """A second walkthrough's findings: values of the wrong type went deep (a torch error for a tensor prompt,
    one request per character for generate_batch("text")) or were taken silently (γ 2.5 became 2, bytes became
    token ids, ignore_eos="yes" was true)."""
    from specdec.drafters.layer_skip import parse_layer_list

    for bad in (dict(num_speculative_tokens=2.5), dict(num_speculative_tokens=True), dict(num_speculative_tokens=None),
                dict(method=5), dict(draft_confidence_threshold="x"), dict(prompt_lookup_min="a")):
        with pytest.raises(SpecdecError):
            SpecConfig(**bad)
    for bad in (dict(stop=5), dict(stop_token_ids=5), dict(ignore_eos="yes")):
        with pytest.raises(SpecdecError):
            SamplingParams(**bad)
    params = SamplingParams(max_tokens=2)
    for prompt, says in ((torch.tensor([1, 2, 3]), "pass .tolist()"), (None, "got NoneType"), (42, "got int"),
                         (b"def f", "got bytes"), (["def", "f"], "token ids must be integers"),
                         ([1.7, 2.2], "token ids must be integers")):
        with pytest.raises(TypeError, match=says):
            specdec.generate(tiny_target, prompt, params)
    with pytest.raises(TypeError, match="target must be a LoadedModel"):
        specdec.generate("tiny", "x", params)
    with pytest.raises(TypeError, match="model must be a built-in name or a path.*got NoneType"):
        specdec.load_model(None)
    with pytest.raises(SpecdecError, match="the model name is empty"):
        specdec.load_model(" ")
    with pytest.raises(TypeError, match="params must be a SamplingParams"):
        specdec.generate(tiny_target, "x", {"max_tokens": 2})
    with pytest.raises(TypeError, match="prompts must be a list of prompts"):
        specdec.generate_batch(tiny_target, "def f", params)
    with pytest.raises(SpecdecError, match="runs backwards"):
        parse_layer_list("5-2")
    assert specdec.generate(tiny_target, (5, 6, 7), params).token_ids  # a tuple of ids is a prompt too


def test_empty_prompt_is_a_clear_error(tiny_target):
    with pytest.raises(SpecdecError, match="empty"):
        specdec.generate(tiny_target, [], SamplingParams(max_tokens=4))


def test_out_of_vocabulary_prompt_ids_are_a_clear_error(tiny_target):
    with pytest.raises(SpecdecError, match="prompt token ids must be in"):
        specdec.generate(tiny_target, [1, 10_000_000, -5], SamplingParams(max_tokens=2))


def test_gamma_must_be_positive():
    with pytest.raises(SpecdecError, match=">= 1"):
        SpecConfig(method="draft_model", num_speculative_tokens=0)
    with pytest.raises(SpecdecError, match="positive integer or 'auto'"):
        SpecConfig(method="draft_model", num_speculative_tokens="many")


def test_unknown_method_is_a_clear_error(tiny_target):
    with pytest.raises(SpecdecError, match="unknown speculative method"):
        specdec.generate(tiny_target, "hi", SamplingParams(max_tokens=4), spec=SpecConfig(method="telepathy"))


def test_draft_model_method_without_draft_is_a_clear_error(tiny_target):
    with pytest.raises(SpecdecError, match="needs a draft model"):
        specdec.generate(tiny_target, "hi", SamplingParams(max_tokens=4), spec=SpecConfig(method="draft_model"))


def test_mismatched_tiny_vocabulary_is_refused(tiny_target, tmp_path):
    """A draft whose vocabulary is a prefix of the target's is refused, naming the first id only one side has."""
    from specdec.errors import IncompatibleModelsError
    from tests.model_fixtures import write_tiny_model
    from tests.tokenizer_fixtures import write_tiny_tokenizer

    write_tiny_model(tmp_path, seed=5)
    write_tiny_tokenizer(tmp_path, vocab_size=300)
    other = specdec.load_model(tmp_path, dtype="float32", device="cpu")
    with pytest.raises(IncompatibleModelsError, match="has 300 tokens.*first token only one side has: id 300"):
        specdec.generate(tiny_target, "hi", SamplingParams(max_tokens=3), draft=other)


def test_unsure_draft_token_is_proposed_and_ends_the_round():
    """Confidence-based early stop: the token whose draft step showed low confidence is still
    proposed (its step is paid; verifying one more token is cheap), and nothing is drafted on it."""
    from specdec.calls import run_now
    from specdec.drafters.model_steps import draft_steps

    sure, unsure = torch.full((8,), -10.0), torch.zeros(8)
    sure[3] = 10.0
    unsure[5] = 0.5  # top probability ~0.2
    steps: list[int] = []

    def step(token: int):  # a step whose forward needs no model: yields no call
        steps.append(token)
        return unsure if len(steps) == 2 else sure
        yield  # noqa: unreachable - makes this a generator

    params = SamplingParams(temperature=0.0)
    draft = run_now(draft_steps(sure, step, 6, params, make_generator(0), confidence_threshold=0.3))
    assert draft.tokens == [3, 3, 5]
    assert steps == [3, 3]  # no step drafted on the unsure token
    assert run_now(draft_steps(sure, step, 6, params, make_generator(0))).tokens == [3] * 6  # 0 = never stop


def test_engine_verifies_only_the_length_the_cost_model_picks(tiny_target, monkeypatch):
    """A draft carrying prefix_accept is cut to VerifyCosts.best_length before verification (the
    drafter still learns what the target committed); output stays exact."""
    import specdec.engine
    from specdec.adaptive import VerifyCosts
    from specdec.api import encode_prompt
    from specdec.drafters.base import Draft

    picked: list[list[float]] = []

    class KeepOne(VerifyCosts):
        def best_length(self, prefix_accept: list[float]) -> int:
            picked.append(list(prefix_accept))
            return 1

    class Sure(Drafter):
        name = "sure"

        def propose(self, context_ids, k):
            return Draft(tokens=[5] * k, prefix_accept=[0.9 ** (j + 1) for j in range(k)])

    monkeypatch.setattr(specdec.engine, "VerifyCosts", KeepOne)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ids = encode_prompt(tiny_target, "def f(x):")
    out = generate_ids(tiny_target.backend, ids, params, Sure(), SpecConfig(method="ngram", num_speculative_tokens=4),
                       tiny_target.tokenizer, make_generator(0))
    assert picked and len(picked[0]) == 4  # the whole draft's estimates were offered
    assert 0 < out.stats.proposed_tokens <= out.stats.target_forwards  # one token per round, not 4
    assert out.token_ids == specdec.generate(tiny_target, "def f(x):", params).token_ids


def test_draft_given_with_a_spec_without_method_is_used(tiny_target):
    """``generate(..., draft=d, spec=SpecConfig(num_speculative_tokens=3))`` speculates with ``d``
    (it used to fall back to plain decoding silently). The shared suffix table starts empty: one that
    already knows this prompt's answer (an earlier test's) drafts it all and the model never runs."""
    from specdec.drafters.suffix import clear_global_caches

    clear_global_caches()
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    out = specdec.generate(tiny_target, PROMPTS[0], params, draft=tiny_target, spec=SpecConfig(num_speculative_tokens=3))
    assert out.stats.method == DEFAULT_DRAFT_METHOD  # the draft model, with the suffix table's help
    assert out.stats.draft_forwards > 0
    only_draft = SpecConfig(method="draft_model", num_speculative_tokens=3, spec_tree="off")
    assert specdec.generate(tiny_target, PROMPTS[0], params, draft=tiny_target, spec=only_draft).stats.acceptance_rate == 1.0


@pytest.mark.parametrize("cap", [0, 1, 2, None])
def test_a_speculation_cap_bounds_every_round_and_keeps_the_output(tiny_target, tiny_draft, cap):
    """``speculate()`` returns the most tokens a round may draft (the server's γ per number of
    requests under load): no round drafts more, the output is the plain output."""
    from specdec.engine import collect, generate_stream

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    ids = tiny_target.tokenizer.encode(PROMPTS[2])
    # chains: a tree's nodes are cut by the cost model too (the cap on trees: the next test)
    spec = SpecConfig(method="draft_model", num_speculative_tokens=4, spec_tree="off")
    plain = generate_ids(tiny_target.backend, ids, params)
    drafter = make_drafter(tiny_target, spec, params, make_generator(0), len(ids) + 24 + 8, draft=tiny_draft)
    chunks = generate_stream(tiny_target.backend, ids, params, drafter, spec, speculate=lambda: cap)
    result = collect(chunks, ids, params)
    assert result.token_ids == plain.token_ids
    longest = max(len(r.drafted) for r in result.stats.rounds)
    assert longest == (4 if cap is None else cap)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("cap", [1, 2])
def test_a_speculation_cap_bounds_a_trees_nodes_too(tiny_target, tiny_draft, cap, temperature):
    """Under load the server's cap bounds verification rows: a token tree (greedy) or a sampled
    chain with alternatives verifies at most ``cap`` nodes a round, as a chain drafts at most
    ``cap`` tokens. Greedy output stays the plain output."""
    from specdec.engine import collect, generate_stream

    params = SamplingParams(temperature=temperature, max_tokens=24, ignore_eos=True, seed=3)
    ids = tiny_target.tokenizer.encode(PROMPTS[2])
    spec = SpecConfig(method="draft_model", num_speculative_tokens=4, spec_tree=8)
    drafter = make_drafter(tiny_target, spec, params, make_generator(0), len(ids) + 24 + 16, draft=tiny_draft)
    result = collect(generate_stream(tiny_target.backend, ids, params, drafter, spec, speculate=lambda: cap), ids, params)
    assert max(result.stats.gamma_history) <= cap
    if temperature == 0.0:
        assert result.token_ids == generate_ids(tiny_target.backend, ids, params).token_ids


def test_a_request_too_short_to_pay_back_the_drafts_prompt_pass_does_not_speculate(tiny_target, tiny_draft):
    """γ=auto: a draft model first reads the whole prompt; a request whose remaining tokens cannot
    pay that back at the measured costs decodes plainly (the server's short chat completions lost to
    plain decoding for it), a longer one speculates. Output is the plain output either way."""
    target_seconds = {t: 0.070 + 0.004 * (t - 1) for t in range(1, 10)}  # an int8-like flat curve
    draft_seconds = {t: 0.013 * t for t in range(1, 10)}  # a draft whose prompt pass costs per token
    saved = tiny_target.backend.step_seconds, tiny_draft.backend.step_seconds
    tiny_target.backend.step_seconds, tiny_draft.backend.step_seconds = target_seconds, draft_seconds
    try:
        prompt = " ".join(["word"] * 13)  # ~40 tokens: a 0.5 s prompt pass at these costs
        spec = SpecConfig(method="draft_model", num_speculative_tokens="auto")
        runs = {}
        for max_tokens in (3, 60):
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
            runs[max_tokens] = specdec.generate(tiny_target, prompt, params, draft=tiny_draft, spec=spec)
            assert runs[max_tokens].token_ids == specdec.generate(tiny_target, prompt, params).token_ids
        # draft_suffix's table still drafts without the draft model: the note says which part sits out
        with_table = specdec.generate(tiny_target, prompt, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
                                      draft=tiny_draft, spec=SpecConfig(method="draft_suffix", num_speculative_tokens="auto"))
        assert with_table.stats.speculation_note.startswith("the draft model sits out (free drafts only): the draft's pass")
    finally:
        tiny_target.backend.step_seconds, tiny_draft.backend.step_seconds = saved
    assert runs[3].stats.proposed_tokens == 0 and runs[3].stats.draft_forwards == 0
    assert "not drafting" in runs[3].stats.summary_line()  # the user is told why
    assert "not drafting" in runs[3].stats.to_dict()["speculation_note"]  # and a bench's results.json
    assert runs[60].stats.proposed_tokens > 0 and not runs[60].stats.speculation_note
    assert "speculation_note" not in runs[60].stats.to_dict()


def test_a_draft_whose_step_was_never_timed_still_drafts(tiny_target, tiny_draft, monkeypatch):
    """On a fresh machine the draft's prompt pass can be priced (its int8 prompt curve was timed) while
    its own drafting step is not: the saving is then unknown, not zero. The first request on a new
    Xeon decoded plainly for that (0.99x); it must draft, and its first rounds measure the step."""
    from specdec.drafters.draft_model import DraftModelDrafter

    monkeypatch.setattr(DraftModelDrafter, "step_seconds", property(lambda self: None))
    monkeypatch.setattr(tiny_target.backend, "step_seconds", {t: 0.070 + 0.004 * (t - 1) for t in range(1, 10)})
    monkeypatch.setattr(tiny_draft.backend, "step_seconds", {t: 0.013 * t for t in range(1, 10)})
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    prompt = " ".join(["word"] * 13)
    spec = SpecConfig(method="draft_model", num_speculative_tokens="auto")
    result = specdec.generate(tiny_target, prompt, params, draft=tiny_draft, spec=spec)
    assert result.stats.proposed_tokens > 0 and not result.stats.speculation_note
    assert result.token_ids == specdec.generate(tiny_target, prompt, params).token_ids


def test_under_load_the_prompt_pass_must_be_paid_back_from_the_loaded_saving(tiny_target, tiny_draft):
    """A server passes ``saving_under_load``: what speculating saves per token with the requests the
    new one will share forwards with. A request long enough to repay its draft's prompt pass alone
    does not draft when the loaded saving is too small, drafts when the server says it is alone
    (None), and its output is the plain output either way."""
    from specdec.engine import collect, generate_stream

    target_seconds = {t: 0.070 + 0.004 * (t - 1) for t in range(1, 10)}
    draft_seconds = {t: 0.013 * t for t in range(1, 10)}
    saved = tiny_target.backend.step_seconds, tiny_draft.backend.step_seconds
    tiny_target.backend.step_seconds, tiny_draft.backend.step_seconds = target_seconds, draft_seconds
    try:
        ids = tiny_target.tokenizer.encode(" ".join(["word"] * 13))
        params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
        spec = SpecConfig(method="draft_model", num_speculative_tokens="auto")
        plain = generate_ids(tiny_target.backend, ids, params)
        results, asked = {}, []
        for name, saving in (("loaded", 1e-4), ("alone", None)):
            drafter = make_drafter(tiny_target, spec, params, make_generator(0), len(ids) + 60 + 16, draft=tiny_draft)
            chunks = generate_stream(tiny_target.backend, ids, params, drafter, spec,
                                     saving_under_load=lambda saving=saving: asked.append(saving) or saving)
            results[name] = collect(chunks, ids, params)
            assert results[name].token_ids == plain.token_ids
    finally:
        tiny_target.backend.step_seconds, tiny_draft.backend.step_seconds = saved
    assert asked == [1e-4, None]  # once per request
    assert results["loaded"].stats.proposed_tokens == 0 and "with the requests sharing its forwards" in results["loaded"].stats.speculation_note
    assert results["alone"].stats.proposed_tokens > 0


def test_corrupt_weights_are_an_error_not_empty_text(tmp_path):
    """A GGUF with 4 KB overwritten by 0xFF (NaN scales) generated nothing and exited 0: the prompt pass's
    last logits row is now checked once per request."""
    from safetensors.torch import load_file, save_file

    from specdec.errors import WeightsError
    from tests.conftest import make_tiny_model_dir

    folder = make_tiny_model_dir(tmp_path / "m")
    weights = load_file(folder / "model.safetensors")
    name = next(key for key in weights if key.endswith("mlp.down_proj.weight"))
    weights[name][0, :8] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    model = specdec.load_model(folder, dtype="float32", quantize="none")
    with pytest.raises(WeightsError, match="NaN/inf logits"):
        specdec.generate(model, "def f(x):", SamplingParams(temperature=0.0, max_tokens=4))


def test_integer_or_prequantized_weights_are_named_not_cast(tmp_path):
    """An integer tensor was cast to float and run (numbers nobody trained); a GPTQ-style checkpoint (qweight,
    scales in place of weight) said only "weights are missing 4 tensors"."""
    from safetensors.torch import load_file, save_file

    from specdec.errors import WeightsError
    from tests.conftest import make_tiny_model_dir

    folder = make_tiny_model_dir(tmp_path / "m")
    original = load_file(folder / "model.safetensors")
    name = next(key for key in original if key.endswith("mlp.down_proj.weight"))
    save_file({**original, name: original[name].to(torch.int8)}, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match=f"tensor {name} holds int8 values, expected floating point"):
        specdec.load_model(folder, dtype="float32", quantize="none")
    gptq = {key: value for key, value in original.items() if key != name}
    gptq[name.removesuffix("weight") + "qweight"] = torch.zeros(4, 4, dtype=torch.int32)
    gptq[name.removesuffix("weight") + "scales"] = torch.ones(4)
    save_file(gptq, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsError, match="already quantized by another tool .*qweight.*original float checkpoint"):
        specdec.load_model(folder, dtype="float32", quantize="none")
    # bitsandbytes int8 (the weight in int8 beside its SCB scales) and FP8 (float8 weights beside their scales)
    bnb = {**original, name: original[name].to(torch.int8), name.removesuffix("weight") + "SCB": torch.ones(4)}
    fp8 = {**original, name: original[name].to(torch.float8_e4m3fn), name + "_scale_inv": torch.ones(1)}
    for checkpoint, named in ((bnb, "SCB"), (fp8, "weight")):
        save_file(checkpoint, folder / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(WeightsError, match=f"already quantized by another tool .*{named}"):
            specdec.load_model(folder, dtype="float32", quantize="none")


def test_alpha_of_a_perfect_drafter_is_one_with_trees_and_stop_strings(tiny_target):
    """The target drafting for itself is always right: α read ~0.5 with token trees (every node counted as
    proposed) and below 1 when a stop string cut an accepted block (drafts past it counted as rejected)."""
    prompt = "def f(x): return x"
    for tree in ("off", 8):
        result = specdec.generate(tiny_target, prompt, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
                                  draft=tiny_target, spec=SpecConfig(method="draft_model", num_speculative_tokens=4, spec_tree=tree))
        assert result.stats.acceptance_rate == 1.0, (tree, result.stats.proposed_tokens, result.stats.accepted_tokens)
        assert (result.stats.tree_rounds > 0) == (tree == 8)
    plain = specdec.generate(tiny_target, prompt, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    stop = plain.text[len(plain.text) // 2:][:3]
    assert stop.strip()
    cut = specdec.generate(tiny_target, prompt, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop]),
                           draft=tiny_target, spec=SpecConfig(method="draft_model", num_speculative_tokens=4, spec_tree="off"))
    assert cut.finish_reason == "stop" and cut.stats.acceptance_rate == 1.0


def test_a_users_drafter_is_named_by_its_method_and_its_broken_proposals_are_clear(tiny_target):
    """The documented extension point: a drafter registered as "mine" reported Stats.method "drafter"; a list
    instead of a Draft, or q without a column for its token, failed deep in the verifier."""
    import json

    import torch

    from specdec.drafters.base import Draft, MethodInfo
    from specdec.drafters.registry import _METHODS, register_method

    class Repeat(Drafter):
        def propose(self, context_ids, k):  # noqa: ANN001, ANN202
            return Draft([context_ids[-1]] * k)

    class Listed(Drafter):
        def propose(self, context_ids, k):  # noqa: ANN001, ANN202
            return [context_ids[-1]] * k

    class Narrow(Drafter):
        def propose(self, context_ids, k):  # noqa: ANN001, ANN202
            return Draft([context_ids[-1]], torch.full((1, 2), 0.5))

    class Silent(Drafter):  # forgot propose: NotImplementedError from deep in the engine, a 500 with no message
        pass

    class Duck:  # not a Drafter
        name = "duck"

    def exploding(res):  # noqa: ANN001, ANN202 - a factory that fails
        raise RuntimeError("factory exploded")

    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=1)
    names = ("mine", "listed", "narrow", "silent", "duck", "boom")
    try:
        for name, drafter in (("mine", Repeat), ("listed", Listed), ("narrow", Narrow), ("silent", Silent), ("duck", Duck)):
            register_method(MethodInfo(name, lambda res, drafter=drafter: drafter(), f"test drafter {name}"))
        register_method(MethodInfo("boom", exploding, "a factory that raises"))
        for name, message in (("silent", "method 'silent': Silent does not define propose"),
                              ("duck", "method 'duck': its factory returned a Duck, not a specdec.Drafter"),
                              ("boom", "method 'boom': its factory failed: RuntimeError: factory exploded")):
            with pytest.raises(DrafterError, match=message):
                specdec.generate(tiny_target, "def f(x):", greedy, spec=SpecConfig(method=name))
        result = specdec.generate(tiny_target, "def f(x):", greedy, spec=SpecConfig(method="mine", num_speculative_tokens=2))
        assert result.stats.method == "mine"
        assert result.token_ids == specdec.generate(tiny_target, "def f(x):", greedy).token_ids
        json.dumps(result.to_dict())  # JSON-ready, stats included
        with pytest.raises(DrafterError, match="drafter 'listed': propose.. returned a list, not a specdec.Draft"):
            specdec.generate(tiny_target, "def f(x):", greedy, spec=SpecConfig(method="listed"))
        with pytest.raises(SpecdecError, match=r"drafter 'narrow': Draft.probs is \(1, 2\)"):
            specdec.generate(tiny_target, "def f(x):", sampled, spec=SpecConfig(method="narrow"))
    finally:
        for name in names:
            _METHODS.pop(name, None)


def test_a_drafter_cannot_change_the_output_or_fail_unnamed(tiny_target):
    """A walkthrough's plugin drafters: one writing into the context_ids it was given changed the text (the engine's
    own list); tokens as a tensor failed in generate_batch's policy ("Boolean value of Tensor …"), as strings deep in
    Draft.clipped; an exception in propose() came out bare; a tree proposed with trees off was dropped whole."""
    import torch

    from specdec.drafters.base import Draft, MethodInfo
    from specdec.drafters.registry import _METHODS, register_method

    class Careless(Drafter):
        def propose(self, context_ids, k):  # noqa: ANN001, ANN202
            context_ids[-1] = 13
            context_ids.append(42)
            return Draft(tokens=[])

    class TensorTokens(Drafter):
        def propose(self, context_ids, k):  # noqa: ANN001, ANN202
            return Draft(tokens=torch.tensor(context_ids[-k:]))

    class Worded(Drafter):
        def propose(self, context_ids, k):  # noqa: ANN001, ANN202
            return Draft(tokens=["x"])

    class Broken(Drafter):
        def propose(self, context_ids, k):  # noqa: ANN001, ANN202
            raise RuntimeError("boom")

    class Branching(Drafter):  # the target itself as a "drafter": its first chain is always right
        def propose(self, context_ids, k):  # noqa: ANN001, ANN202
            right = specdec.generate(tiny_target, context_ids, SamplingParams(temperature=0.0, max_tokens=2,
                                                                             ignore_eos=True)).token_ids
            return Draft(tokens=[right[0], 3, right[1]], parents=[-1, -1, 0])

    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    plain = specdec.generate(tiny_target, "def f(x):", greedy).token_ids
    drafters = {"careless": Careless, "tensor_tokens": TensorTokens, "worded": Worded, "broken": Broken,
                "branching": Branching}
    try:
        for name, drafter in drafters.items():
            register_method(MethodInfo(name, lambda res, drafter=drafter: drafter(), f"test drafter {name}",
                                       options=("num_speculative_tokens", "spec_tree")))
        spec = SpecConfig(method="careless", num_speculative_tokens=4)
        assert specdec.generate(tiny_target, "def f(x):", greedy, spec=spec).token_ids == plain
        assert specdec.generate_batch(tiny_target, ["def f(x):"], greedy, spec=spec)[0].token_ids == plain
        for name, message in (("tensor_tokens", "Draft.tokens must be a list of int token ids, got Tensor"),
                              ("worded", "Draft.tokens must be a list of int token ids, got a list holding str"),
                              ("broken", "drafter 'broken': propose.. failed: RuntimeError: boom")):
            spec = SpecConfig(method=name, num_speculative_tokens=4)
            with pytest.raises(DrafterError, match=message):
                specdec.generate(tiny_target, "def f(x):", greedy, spec=spec)
            with pytest.raises(DrafterError, match=message):
                specdec.generate_batch(tiny_target, ["def f(x):", "x = 1"], greedy, spec=spec)
        branching = specdec.generate(tiny_target, "def f(x):", greedy,
                                     spec=SpecConfig(method="branching", num_speculative_tokens=4, spec_tree="off"))
        assert branching.token_ids == plain and branching.stats.accepted_tokens > 0  # its first chain, verified
    finally:
        for name in drafters:
            _METHODS.pop(name, None)


def test_the_readmes_custom_drafter_runs_as_written(tiny_target, monkeypatch, capsys):
    """The README's "Custom drafters" snippet, run as written (the tiny model loaded in the real one's
    place): the public names exist and the method runs through generate, exact."""
    import re
    from pathlib import Path

    from specdec.drafters.registry import _METHODS

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("### Custom drafters", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    monkeypatch.setattr(specdec, "load_model", lambda *args, **kwargs: tiny_target)
    try:
        exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README's own example
        assert _METHODS["last_occurrence"].summary == "copy what followed the last token before"
        spec = SpecConfig(method="last_occurrence", num_speculative_tokens=4)
        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        assert (specdec.generate(tiny_target, "x = [0, 0,", params, spec=spec).token_ids
                == specdec.generate(tiny_target, "x = [0, 0,", params).token_ids)
    finally:
        _METHODS.pop("last_occurrence", None)
    assert capsys.readouterr().out.strip()  # it printed the text and α


def test_plain_names_and_aliases_work_in_the_library_and_results_serialise(tiny_target):
    """SpecConfig(method="ar") — what Stats.method says for plain decoding — was an unknown method in the library."""
    import dataclasses
    import json

    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    plain = specdec.generate(tiny_target, "def f(x):", greedy, spec=SpecConfig(method="ar"))
    assert plain.stats.method == "ar" and plain.stats.proposed_tokens == 0
    assert specdec.generate(tiny_target, "def f(x):", greedy, spec=SpecConfig(method="prompt-lookup")).token_ids == plain.token_ids
    histogram = dataclasses.asdict(specdec.generate(tiny_target, "def f(x):", greedy, spec=SpecConfig(method="ngram")).stats)
    assert all(isinstance(k, int) for k in histogram["accepted_len_histogram"])  # a Counter became {(k, n): 1}
    chunks = list(specdec.stream(tiny_target, "def f(x):", greedy))
    assert json.loads(json.dumps(chunks[-1].to_dict()))["stats"]["generated_tokens"] == 6
    assert len(repr(plain)) < 2000


def test_reset_suffix_cache_forgets_earlier_answers(tiny_target):
    """A second run of the same prompt drafts from the first's output; the library had no public way to forget it."""
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    spec = SpecConfig(method="suffix", num_speculative_tokens=4)
    specdec.reset_suffix_cache()
    first = specdec.generate(tiny_target, "def g(y):", greedy, spec=spec).stats.accepted_tokens
    again = specdec.generate(tiny_target, "def g(y):", greedy, spec=spec).stats.accepted_tokens
    specdec.reset_suffix_cache()
    fresh = specdec.generate(tiny_target, "def g(y):", greedy, spec=spec).stats.accepted_tokens
    assert again > first and fresh == first


def test_a_suffix_cache_of_no_entries_keeps_nothing_across_requests(tiny_target):
    """set_suffix_cache_entries (serve --suffix-cache-entries): the process-wide table's cap, existing tables too;
    0 keeps nothing, so a repeated prompt drafts as a fresh one did."""
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    spec = SpecConfig(method="suffix", num_speculative_tokens=4)
    specdec.reset_suffix_cache()
    try:
        first = specdec.generate(tiny_target, "def g(y):", greedy, spec=spec).stats.accepted_tokens
        specdec.set_suffix_cache_entries(0)  # the table that holds the first answer empties
        assert specdec.generate(tiny_target, "def g(y):", greedy, spec=spec).stats.accepted_tokens == first
        assert specdec.generate(tiny_target, "def g(y):", greedy, spec=spec).stats.accepted_tokens == first
        specdec.set_suffix_cache_entries(10_000)
        specdec.generate(tiny_target, "def g(y):", greedy, spec=spec)
        assert specdec.generate(tiny_target, "def g(y):", greedy, spec=spec).stats.accepted_tokens > first
    finally:
        specdec.set_suffix_cache_entries(DEFAULT_SUFFIX_CACHE_ENTRIES)
        specdec.reset_suffix_cache()
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(SpecdecError, match="max_entries must be an integer >= 0"):
            specdec.set_suffix_cache_entries(bad)


def test_fields_changed_after_construction_are_checked_at_generate(tiny_target):
    params = SamplingParams(temperature=0.0, max_tokens=4)
    params.temperature = -1.0
    with pytest.raises(SpecdecError, match="temperature must be a finite number >= 0"):
        specdec.generate(tiny_target, "def f(x):", params)
    spec = SpecConfig(method="ngram")
    spec.num_speculative_tokens = 0
    with pytest.raises(SpecdecError, match="num_speculative_tokens"):
        specdec.generate(tiny_target, "def f(x):", SamplingParams(max_tokens=4), spec=spec)


def test_the_library_warns_about_a_draft_or_options_the_method_does_not_read(tiny_target):
    import warnings

    greedy = SamplingParams(temperature=0.0, max_tokens=3)
    with pytest.warns(UserWarning, match="draft= is not used by ngram"):
        specdec.generate(tiny_target, "def f(x):", greedy, draft=tiny_target, spec=SpecConfig(method="ngram"))
    with pytest.warns(UserWarning, match="ngram does not read SpecConfig exit_layer"):
        specdec.generate(tiny_target, "def f(x):", greedy, spec=SpecConfig(method="ngram", exit_layer=3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say: each read by its method
        specdec.generate(tiny_target, "def f(x):", greedy, spec=SpecConfig(method="ngram", prompt_lookup_max=3))
        specdec.generate(tiny_target, "def f(x):", greedy, draft=tiny_target)
        list(specdec.stream(tiny_target, "def f(x):", greedy))


def test_stream_refuses_a_request_at_the_call_not_the_first_next(tiny_target):
    with pytest.raises(ContextLengthError):
        specdec.stream(tiny_target, "hi " * 600, SamplingParams(max_tokens=4))  # no next(): the call itself raises


def test_a_draft_no_smaller_than_its_target_is_warned_about_once(tiny_target, caplog, monkeypatch):
    """Exact, but a draft step that reads as many bytes as the target's cannot pay: said once per pair, not per request."""
    import logging

    from specdec import compat

    monkeypatch.setattr(compat, "_WARNED_SIZES", set())
    with caplog.at_level(logging.WARNING, logger="specdec.compat"):
        compat.check_pair(tiny_target, tiny_target)
        compat.check_pair(tiny_target, tiny_target)
    warned = [r for r in caplog.records if "speculation cannot be faster than plain decoding" in r.getMessage()]
    assert len(warned) == 1


def test_the_bandwidth_figure_counts_the_keys_and_values_each_forward_reads(tiny_target):
    """achieved_gb_per_s counted weights only: at a 3k-token context a step reads ~17 % more (the target's cache), so
    the figure read below the memory's limit while the steps were at it. Each decode forward reads the cache so far."""
    cfg = tiny_target.backend.config
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4  # float32 keys and values, every layer
    assert tiny_target.backend.kv_bytes_per_token == per_token
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for spec in (None, SpecConfig(method="ngram", num_speculative_tokens=3)):
        stats = specdec.generate(tiny_target, "def f(x):\n    return x", params, spec=spec).stats
        contexts, committed = [], 0
        for round_ in stats.rounds:
            contexts.append(stats.prompt_tokens + committed)
            committed += len(round_.committed)
        assert stats.target_forwards == len(stats.rounds) > 0
        assert stats.kv_bytes_read == per_token * sum(contexts)
        weights = stats.target_forwards * stats.weight_bytes + (stats.draft_forwards or 0) * stats.draft_weight_bytes
        assert stats.achieved_gb_per_s == pytest.approx((weights + stats.kv_bytes_read) / stats.decode_time_s / 1e9)
