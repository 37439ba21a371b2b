"""--disable-speculation-above read against the recent load (policy.py), with a fake clock."""

from __future__ import annotations

import pytest

from specdec.policy import LoadAverage, requests_now, speculation_cap


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(load: LoadAverage, clock: Clock, pattern: list[tuple[int, float]], cycles: int) -> None:
    """Hold each count for its seconds, ``cycles`` times over."""
    for _ in range(cycles):
        for count, seconds in pattern:
            load.set(count)
            clock.now += seconds


def test_the_average_weights_each_count_by_how_long_it_was_held():
    clock = Clock()
    load = LoadAverage(time_constant_s=5.0, clock=clock)
    assert load.value() == 0.0
    load.set(4)
    clock.now += 1000  # long past the time constant
    assert load.value() == pytest.approx(4.0)
    load.set(0)
    clock.now += 5.0  # one time constant: 1/e of the way back
    assert load.value() == pytest.approx(4.0 / 2.718281828, rel=1e-6)


def test_one_user_back_to_back_speculates_and_two_do_not_even_in_their_gaps():
    clock = Clock()
    one = LoadAverage(clock=clock)
    run(one, clock, [(1, 3.0), (0, 0.05)], cycles=20)  # a request of 3 s, then the client's turnaround
    one.set(1)  # its next request starts
    assert speculation_cap(1, None, requests_now(1, one)) is None

    clock2 = Clock()
    two = LoadAverage(clock=clock2)
    # two closed-loop clients: both busy, then one is between requests for a moment
    run(two, clock2, [(2, 3.0), (1, 0.05)], cycles=20)
    assert speculation_cap(1, None, requests_now(1, two)) == 0  # momentarily alone, but the server is not idle
    assert speculation_cap(2, None, requests_now(1, two)) is None  # a limit of 2 allows it
    assert speculation_cap(2, {1: 5, 2: 2}, requests_now(1, two)) == 2  # and γ for two requests caps it


def test_the_load_falling_lets_speculation_back_and_none_never_switches_off():
    clock = Clock()
    load = LoadAverage(clock=clock)
    run(load, clock, [(8, 1.0)], cycles=30)
    load.set(1)
    assert speculation_cap(1, None, requests_now(1, load)) == 0
    clock.now += 30.0  # six time constants of one user
    assert speculation_cap(1, {1: 3}, requests_now(1, load)) is None  # alone: the request's own γ
    assert speculation_cap(1, None, requests_now(2, load)) == 0  # the count now still counts
    assert speculation_cap(None, None, requests_now(64, load)) is None


def test_the_traffic_alpha_moves_the_gamma_table():
    """α from the requests' rounds (accepted over Bernoulli trials), and the γ per number of
    requests computed at it: a drafter the target mostly rejects gets no speculation under load."""
    from specdec.policy import TRAFFIC_PRIOR_TRIALS, AcceptanceMeter, GammaTable
    from specdec.stats import Round
    from specdec.cost_model import batch_gammas

    meter = AcceptanceMeter(prior=0.7)
    assert meter.alpha == pytest.approx(0.7)
    warm_up = [Round(drafted=[1, 2], accepted=2, forced=0, committed=[1, 2, 9])] * 3  # one short request, all accepted
    meter.observe(warm_up)
    assert 0.74 < meter.alpha < 0.8  # the prior counts as about one request's trials: moved, not taken over
    rejected_early = Round(drafted=[1, 2, 3, 4], accepted=0, forced=0, committed=[9])  # one trial each
    for _ in range(int(TRAFFIC_PRIOR_TRIALS)):  # about a request's worth, round by round as they run
        meter.observe([rejected_early])
    assert 0.25 < meter.alpha < 0.45  # about halfway: it does not take a finished request to move
    for _ in range(10 * int(TRAFFIC_PRIOR_TRIALS)):
        meter.observe([rejected_early])
    assert meter.alpha < 0.05
    meter.observe([Round(drafted=[], accepted=0, forced=0, committed=[9])])  # plain rounds say nothing
    assert meter.alpha < 0.05

    steep = {1: 0.075, 2: 0.076, 4: 0.080, 8: 0.105}
    draft = {1: 0.013, 2: 0.018, 4: 0.0245, 8: 0.047}
    table = GammaTable(lambda alpha: batch_gammas(steep, alpha, 4, draft, 4))
    assert table.for_alpha(0.72) == batch_gammas(steep, 0.7, 4, draft, 4)  # steps of 0.05
    assert table.for_alpha(0.7)[2] >= 1
    assert not any(table.for_alpha(meter.alpha).values())
    from specdec.policy import BatchPolicy

    policy = BatchPolicy(None, table, acceptance=meter)
    assert policy.cap(2) == 0  # under load, nothing drafted at this α
    assert policy.cap(1) is None  # alone, the request's own γ: a limit of 0 once capped every lone request


def test_the_meter_forgets_by_trials_however_rounds_are_grouped():
    """Rounds arrive one chunk at a time from running requests, or a request's worth at once: the
    forgetting runs per acceptance trial, so the grouping moves α only by the order within a group."""
    from specdec.policy import AcceptanceMeter
    from specdec.stats import Round

    rounds = [Round([1, 2, 3], a, 0, [9]) for a in (3, 0, 1, 3, 2, 0, 3, 1)] * 6
    one_by_one, all_at_once = AcceptanceMeter(prior=0.7), AcceptanceMeter(prior=0.7)
    for r in rounds:
        one_by_one.observe([r])
    all_at_once.observe(rounds)
    assert one_by_one.alpha == pytest.approx(all_at_once.alpha, abs=0.05)
    assert one_by_one.measured and all_at_once.measured


def test_serve_auto_builds_the_table_from_the_loaded_models_curves(monkeypatch):
    from types import SimpleNamespace

    from specdec import policy, step_costs
    from specdec.policy import PromptShare, measured_gamma_table
    from specdec.config import SpecConfig

    monkeypatch.setattr(step_costs, "full_curve", lambda cfg, mode: None)  # no cached curve: the backends' own
    monkeypatch.setattr(policy, "DRAFT_FORWARD_PRIOR", 1.0)  # the curves as they are (the prior: the next test)

    def model(seconds, prompt_seconds=None):
        config = SimpleNamespace(vocab_size=1000)
        backend = SimpleNamespace(config=config, step_seconds=seconds, step_ratios={}, dtype_name="int8", mode="int8")
        backend.prompt_backend = backend if prompt_seconds is None else SimpleNamespace(step_seconds=prompt_seconds, mode="int8")
        return SimpleNamespace(config=config, backend=backend)

    target = model({1: 0.075, 2: 0.076, 4: 0.080, 8: 0.105})
    draft = model({1: 0.013, 2: 0.018, 4: 0.0245, 8: 0.047}, prompt_seconds={16: 0.020, 32: 0.0216})  # 0.1 ms a prompt row
    table = measured_gamma_table(SpecConfig(method="draft_model", num_speculative_tokens=4), target, draft, 8)
    assert table is not None and table.for_alpha(0.7) == {1: 3, 2: 1, 3: 1, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0}
    # a draft whose pass over each new prompt costs more (its own int4 rows: 5.6 ms each) speculates less
    costly = measured_gamma_table(SpecConfig(method="draft_model", num_speculative_tokens=4), target,
                                  model(draft.backend.step_seconds), 8)
    assert sum(costly.for_alpha(0.7).values()) < sum(table.for_alpha(0.7).values())
    # what speculating saves per token shrinks as requests share forwards, and is 0 where γ is (the
    # draft's prompt passes counted as the table counts them)
    savings = [table.saving(0.7, requests) for requests in (1, 2, 3, 4)]
    assert savings[0] > savings[1] > savings[2] > 0 and savings[3] == 0
    # traffic whose prompts are 4x its outputs (the draft reads 4 prompt rows per generated token)
    # speculates at fewer loads; the table follows the measured share
    share, slower_prompts = PromptShare(), model(draft.backend.step_seconds, prompt_seconds={16: 0.020, 32: 0.036})
    once = measured_gamma_table(SpecConfig(method="draft_model", num_speculative_tokens=4), target, slower_prompts, 8)
    long_prompts = measured_gamma_table(SpecConfig(method="draft_model", num_speculative_tokens=4), target,
                                        slower_prompts, 8, prompt_share=share)
    assert long_prompts.for_alpha(0.7) == once.for_alpha(0.7)  # the prior: 1 prompt token per generated one
    for _ in range(20):
        share.observe(256, 64)
    assert abs(share.value - 4.0) < 0.1
    assert once.for_alpha(0.7) == {1: 3, 2: 1, 3: 1, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0}
    assert long_prompts.for_alpha(0.7) == {1: 3, 2: 1, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0}
    windowed = PromptShare(window=64)  # a draft reading at most its 64-token context window
    for _ in range(20):
        windowed.observe(256, 64)
    assert abs(windowed.value - 1.0) < 0.01
    assert measured_gamma_table(SpecConfig(), target, draft, 8) is None  # no method: nothing to cap
    assert measured_gamma_table(SpecConfig(method="draft_model"), model(None), draft, 8) is None  # unmeasured


def test_a_request_gate_latches_off_but_only_pauses_for_a_waiting_prompt():
    """RequestGate: the policy's cap, once 0 kept 0 (a draft model would otherwise catch up on all it
    missed); a prompt waiting stops drafting for that round only."""
    from specdec.policy import RequestGate

    caps, pending = [3, 2, 0, 4], [False]
    gate = RequestGate(lambda: caps.pop(0), lambda: pending[0])
    assert gate() == 3
    pending[0] = True
    assert gate() == 0 and gate.speculating  # paused, not off
    pending[0] = False
    assert gate() == 0 and not gate.speculating  # the policy said none
    assert gate() == 0 and caps == [4]  # and it stays none without asking again


def test_a_fixed_limit_holds_a_tree_sharing_forwards_to_a_chains_rows():
    """Under ``--disable-speculation-above N`` (or ``never``) there is no γ table: alone a request
    drafts as it likes; sharing forwards it may draft at most the configured γ maximum, so a token
    tree verifies no more rows than the chain would (its extra rows add up across requests)."""
    from specdec.policy import BatchPolicy

    assert speculation_cap(8, None, 1, sharing=4) is None  # alone: the request's own budget
    assert speculation_cap(8, None, 3, sharing=4) == 4
    assert speculation_cap(8, None, 9, sharing=4) == 0  # over the limit: none
    assert speculation_cap(None, None, 64, sharing=4) == 4  # never switched off, still held to a chain's rows
    assert speculation_cap(8, {2: 2}, 2, sharing=4) == 2  # a γ table, where there is one, decides
    policy = BatchPolicy(limit=8, sharing_cap=4)
    assert [policy.cap(n) for n in (1, 2, 8, 9)] == [None, 4, 4, 0]
    assert BatchPolicy(limit=8).cap(2) is None  # unmeasured costs (no sharing cap): rows count as free


def test_fixed_settings_cap_sharing_trees_only_where_rows_are_priced(tiny_target):
    """The sharing cap comes with a fixed setting on a target with measured step costs (a CPU
    kernel mode), not on one whose rows are unmeasured (float weights, CUDA: taken as free)."""
    from specdec.config import SpecConfig
    from specdec.policy import BatchPolicy

    spec = SpecConfig(method="draft_model", num_speculative_tokens=4)
    saved = tiny_target.backend.step_seconds
    try:
        tiny_target.backend.step_seconds = {t: 0.05 + 0.005 * t for t in range(1, 10)}
        assert BatchPolicy.from_setting(6, spec, tiny_target, None, 8).sharing_cap == 4
        assert BatchPolicy.from_setting("never", spec, tiny_target, None, 8).sharing_cap == 4
        tiny_target.backend.step_seconds = None
        assert BatchPolicy.from_setting(6, spec, tiny_target, None, 8).sharing_cap is None
    finally:
        tiny_target.backend.step_seconds = saved


def test_a_fixed_limit_sizes_gamma_auto_drafts_from_the_table():
    """γ=auto under ``--disable-speculation-above N`` (or never): the user's N says when speculation stops;
    below it the γ table sizes a sharing request's drafts (at least 1 token), because each request's own
    controller sees the shared forward's time as its verify cost and drafted too much (session 49: at 4
    concurrent requests 1.3-1.4x γ=4's tokens, 0.90x its tokens/s). The table's saving does not turn a
    request's drafting off there: the user asked for speculation up to N."""
    from specdec.policy import BatchPolicy, GammaTable

    table = GammaTable(lambda alpha: {1: 6, 2: 3, 3: 1, 4: 0, 5: 0}, lambda alpha, requests: 0.0)
    fixed = BatchPolicy(4, table, sharing_cap=8, table_limits=False)
    assert [fixed.cap(n) for n in (1, 2, 3, 4, 5)] == [None, 3, 1, 1, 0]
    assert fixed.saving(2) is None
    never = BatchPolicy(None, table, sharing_cap=8, table_limits=False)
    assert [never.cap(n) for n in (1, 2, 5, 9)] == [None, 3, 1, 1]  # past the table's sizes: its last
    automatic = BatchPolicy(None, table, sharing_cap=8)  # --disable-speculation-above auto: the table stops it too
    assert [automatic.cap(n) for n in (1, 2, 3, 4)] == [None, 3, 1, 0]
    assert automatic.saving(2) == 0.0


def test_fixed_settings_build_a_table_only_for_gamma_auto(tiny_target):
    from specdec.config import SpecConfig
    from specdec.policy import BatchPolicy

    saved = tiny_target.backend.step_seconds
    try:
        tiny_target.backend.step_seconds = {t: 0.05 + 0.005 * t for t in range(1, 10)}
        for setting in (6, "never"):
            sized = BatchPolicy.from_setting(setting, SpecConfig(method="suffix", num_speculative_tokens="auto"),
                                             tiny_target, None, 8)
            assert sized.table is not None and not sized.table_limits
            assert sized.limit == (6 if setting == 6 else None) and 1 <= sized.cap(2) <= 8
            assert BatchPolicy.from_setting(setting, SpecConfig(method="suffix", num_speculative_tokens=4),
                                            tiny_target, None, 8).table is None
    finally:
        tiny_target.backend.step_seconds = saved


def test_unmeasured_batched_draft_forwards_cost_the_prior_until_measured(monkeypatch):
    """A draft model's batched forward costs DRAFT_FORWARD_PRIOR x its curve until the scheduler has
    timed forwards of that many requests; then what they cost. With the curve alone a fresh server's
    first wave of 8 chat requests drafted at γ=1 and ran 0.91x speculation off (session 50)."""
    from types import SimpleNamespace

    from specdec import policy, step_costs
    from specdec.config import SpecConfig
    from specdec.cost_model import Curve
    from specdec.forward_costs import Forward, ForwardCosts

    monkeypatch.setattr(step_costs, "full_curve", lambda cfg, mode: None)
    monkeypatch.setattr(step_costs, "draft_curve", lambda cfg, mode, vocab: None)

    def model(seconds):
        config = SimpleNamespace(vocab_size=1000)
        backend = SimpleNamespace(config=config, step_seconds=seconds, step_ratios={}, dtype_name="int8", mode="int8")
        backend.prompt_backend = backend
        return SimpleNamespace(config=config, backend=backend)

    target = model({1: 0.060, 2: 0.0605, 4: 0.061, 8: 0.062, 16: 0.066, 32: 0.074})  # flat: AMX int8
    draft = model({1: 0.008, 2: 0.009, 4: 0.012, 8: 0.018, 16: 0.026})
    spec = SpecConfig(method="draft_model", num_speculative_tokens="auto")
    monkeypatch.setattr(policy, "DRAFT_FORWARD_PRIOR", 1.0)
    optimistic = policy.measured_gamma_table(spec, target, draft, 8).for_alpha(0.7)
    monkeypatch.setattr(policy, "DRAFT_FORWARD_PRIOR", 2.0)
    costs = ForwardCosts()
    table = policy.measured_gamma_table(spec, target, draft, 8, costs)
    prior = table.for_alpha(0.7)
    assert optimistic[8] >= 1 and prior[8] == 0 and sum(prior.values()) < sum(optimistic.values())
    curve = draft.backend.step_seconds
    for requests in range(1, 9):  # forwards measured at the curve's own cost: the prior leaves those sizes
        for _ in range(3):
            costs.observe(Forward(draft.backend, "draft", requests, requests, 0, Curve("d", curve).cost(requests)))
    assert table.for_alpha(0.7) == optimistic


def test_tree_rounds_count_as_chains_of_their_first_choices():
    """The traffic's α plans chains (under load a tree is held to a chain's rows), so a tree round counts
    as the chain of its first choices (each node's lowest-numbered child) would have: a path through a
    second choice is a rejection there, and a tree's depth is not its trials. Counted by depth, a tree
    drafter's chat traffic read α 0.80-0.93 where its chains were accepted at 0.5-0.6 (session 50)."""
    from specdec.drafters.base import Draft
    from specdec.rounds import tree_round
    from specdec.policy import AcceptanceMeter
    from specdec.stats import Round, Stats

    # root -> 0 (first choice), 1; 0 -> 2 -> 4 (first choices); 1 -> 3
    draft = Draft(tokens=[10, 11, 12, 13, 14], parents=[-1, -1, 0, 1, 2])
    assert tree_round(draft, [1, 3], Stats())[1] == (3, 0)  # won through a second choice at depth 1
    assert tree_round(draft, [0, 2], Stats())[1] == (3, 2)  # first choices, stopped before the chain's end
    assert tree_round(draft, [0, 2, 4], Stats())[1] == (3, 3)
    assert tree_round(draft, [], Stats())[1] == (3, 0)
    second_choice = Round([11, 13], 2, 0, [11, 13, 9], first_choices=(3, 0))
    assert second_choice.chain_trials() == (0, 1)
    assert Round([10, 12, 11], 2, 0, [10, 12, 9], first_choices=(3, 2)).chain_trials() == (2, 3)
    assert Round([10, 12, 14], 3, 0, [10, 12, 14, 9], first_choices=(3, 3)).chain_trials() == (3, 3)
    assert Round([10, 12, 14], 1, 0, [10, 9]).chain_trials() == (1, 2)  # a chain: as before

    meter = AcceptanceMeter(prior=0.7)
    for _ in range(40):
        meter.observe([second_choice] * 10)  # every round accepted 2 tokens, none of them first choices
    assert meter.alpha < 0.05
