"""The load policy's curves corrected by what the scheduler's batched forwards cost (forward_costs.py):
on a 2-core AMX Xeon the probe-based curves made speculation look profitable at 8 concurrent requests
where it ran at 0.85-0.94x plain, because a batch of N requests costs more than one sequence's chunk."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from specdec.calls import ModelCall
from specdec.forward_costs import Forward, ForwardCosts
from specdec.scheduler import END, Batcher, Stream

TARGET = {1: 0.075, 2: 0.076, 4: 0.080, 8: 0.105}
DRAFT = {1: 0.013, 2: 0.018, 4: 0.0245, 8: 0.047}


def test_decode_forwards_are_kept_by_rows_and_requests_prompt_passes_are_not():
    costs, target, draft = ForwardCosts(min_samples=3), object(), object()
    for seconds in (0.08, 0.10, 0.09):
        costs.observe(Forward(target, "target", 8, 8, 0, seconds))
    costs.observe(Forward(target, "target", 8, 8, 1, 5.0))  # carried a prompt pass: another curve
    costs.observe(Forward(target, "target", 2, 16, 0, 0.2))  # only once so far: not yet a measurement
    assert costs.measured(target, "rows") == {8: 0.09}
    assert costs.measured(target, "requests") == {8: 0.09}
    for _ in range(3):
        costs.observe(Forward(draft, "draft", 1, 1, 0, 0.015))
        costs.observe(Forward(draft, "draft", 1, 60, 0, 0.050))  # a draft's catch-up over a prompt, not a step
    assert costs.measured(draft, "requests") == {1: 0.015}
    assert costs.measured(draft, "rows") == {1: 0.015, 60: 0.050}
    ratios = costs.ratios(draft, DRAFT, "requests")
    assert ratios.keys() == {1} and abs(ratios[1] - 0.015 / 0.013) < 1e-9
    assert costs.measured(object(), "rows") == {}  # per model


def test_the_window_forgets_old_forwards():
    costs, model = ForwardCosts(window=4, min_samples=2), object()
    for seconds in (1.0, 1.0, 1.0, 1.0, 0.1, 0.1, 0.1):
        costs.observe(Forward(model, "target", 1, 1, 0, seconds))
    assert costs.measured(model, "rows") == {1: 0.1}


def fake_model(seconds, prompt_seconds=None):
    config = SimpleNamespace(vocab_size=1000)
    backend = SimpleNamespace(config=config, step_seconds=seconds, step_ratios={}, dtype_name="int8", mode="int8")
    backend.prompt_backend = backend if prompt_seconds is None else SimpleNamespace(step_seconds=prompt_seconds, mode="int8")
    return SimpleNamespace(config=config, backend=backend)


def test_the_gamma_table_follows_what_batched_forwards_cost(monkeypatch):
    """A draft model whose batched steps cost 2x its curve speculates at fewer loads, and the table is
    rebuilt when the measurement moves (it is cached per α and measured costs)."""
    from specdec import policy, step_costs
    from specdec.config import SpecConfig
    from specdec.policy import measured_gamma_table

    monkeypatch.setattr(step_costs, "full_curve", lambda cfg, mode: None)  # no cached curve: the backends' own
    monkeypatch.setattr(policy, "DRAFT_FORWARD_PRIOR", 1.0)  # unmeasured sizes at the curve (the prior: test_server_policy)
    target, draft = fake_model(TARGET), fake_model(DRAFT, prompt_seconds={16: 0.020, 32: 0.0216})
    costs = ForwardCosts()
    table = measured_gamma_table(SpecConfig(method="draft_model", num_speculative_tokens=4), target, draft, 8, costs)
    before = table.for_alpha(0.7)
    assert before == {1: 3, 2: 1, 3: 1, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0}
    for requests in (1, 2, 4):
        for _ in range(3):
            costs.observe(Forward(draft.backend, "draft", requests, requests, 0, 2 * DRAFT[requests]))
    after = table.for_alpha(0.7)
    assert after == {1: 2, 2: 1, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0}
    assert table.saving(0.7, 3) == 0.0 < table.saving(0.7, 2)  # nothing saved where nothing is drafted
    # the target measured cheaper than its curve at the rows speculation adds: speculation pays again
    for rows in (1, 2, 4, 8):
        for _ in range(3):
            costs.observe(Forward(target.backend, "target", 1, rows, 0, TARGET[1]))
    assert sum(table.for_alpha(0.7).values()) > sum(after.values())


def test_a_slow_small_size_does_not_make_verification_rows_look_free(monkeypatch):
    """Forwards of 7 requests slowed by request turnover (another request's HTTP and tokenizing on the
    same 2 cores) measured 1.24x their curve, 8 requests 1.08x. Rescaled size by size, the smaller sizes
    took 1.24 and the non-decreasing curve priced 8 and 16 rows alike: the table drafted at 8 concurrent
    chat requests and served 0.85x speculation off. Timing noise only slows a forward, so a size costs
    at most what a larger size measured."""
    from specdec import policy, step_costs
    from specdec.config import SpecConfig
    from specdec.forward_costs import at_most_larger
    from specdec.policy import measured_gamma_table

    assert at_most_larger({1: 0.071, 2: 0.077, 4: 0.078, 8: 0.070, 16: 0.076}) == {
        1: 0.070, 2: 0.070, 4: 0.070, 8: 0.070, 16: 0.076}
    assert at_most_larger({1: 1.0, 2: 2.0}) == {1: 1.0, 2: 2.0}
    monkeypatch.setattr(step_costs, "full_curve", lambda cfg, mode: None)
    monkeypatch.setattr(policy, "DRAFT_FORWARD_PRIOR", 1.0)
    flat = {1: 0.057, 2: 0.061, 4: 0.062, 8: 0.0646, 16: 0.0695, 32: 0.0864}  # int8 1.5B on AMX tiles
    target, draft = fake_model(flat), fake_model({1: 0.012, 2: 0.013, 4: 0.016, 8: 0.024, 16: 0.040})
    costs = ForwardCosts()
    table = measured_gamma_table(SpecConfig(method="draft_model", num_speculative_tokens=4), target, draft, 8, costs)
    for _ in range(3):
        costs.observe(Forward(target.backend, "target", 7, 7, 0, 1.24 * 0.0640))  # turnover: slowed
        costs.observe(Forward(target.backend, "target", 8, 8, 0, 1.08 * flat[8]))
    assert table.for_alpha(0.8)[8] == 0  # size by size: γ=2 at 8
    assert table.for_alpha(0.8)[2] >= 1  # where verification rows are cheap it still drafts


def test_the_batcher_reports_every_forward():
    """Each forward, the target's and the draft model's, with its requests, rows, prompt passes and time."""

    class Model:
        def __init__(self, batches: bool) -> None:
            self.batches = batches

        def forward_batch(self, calls, vocab_limit=None):
            return [torch.zeros(len(tokens), 4) for _, tokens, _, _ in calls]

        def weight_passes(self, calls):
            return 1 if self.batches else calls

    target, draft, heard = Model(batches=True), Model(batches=False), []

    def request(prompt_len):
        yield ModelCall(target, None, [0] * prompt_len, 1, prompt=True)
        yield ModelCall(draft, None, [0], role="draft")
        yield ModelCall(target, None, [0, 0])

    batcher, done = Batcher(on_forward=heard.append), []
    for length in (3, 5):
        batcher.add(Stream(request(length), lambda item: done.append(item) if item is END else None, lambda: False))
    while batcher.streams:
        batcher.step()
    assert len(done) == 2
    assert [(f.backend is target, f.role, f.requests, f.rows, f.prompt_calls) for f in heard] == [
        (True, "target", 2, 8, 2), (False, "draft", 2, 2, 0), (True, "target", 2, 4, 0)]
    # the prompt tokens computed (the server's throughput line) and how often the weights were read
    assert [(f.prompt_rows, f.weight_passes) for f in heard] == [(8, 1), (0, 2), (0, 1)]
    assert all(f.seconds >= 0 for f in heard)
