"""The probe's step-cost curve rescaled by timed forwards of the loaded model (specdec.step_calibration):
the arithmetic, the load path that times it, and what it changes for γ=auto — a draft curve cached
in a busy moment no longer switches drafting off — while seeded sampled requests keep planning from
the cached curve alone."""

from __future__ import annotations

import dataclasses

import pytest

import specdec
from specdec import step_calibration, step_costs
from specdec.config import SpecConfig
from specdec.sampling import SamplingParams
from specdec.step_calibration import calibrate, planning_curve, rescaled


def test_each_size_takes_the_ratio_of_the_nearest_timed_size():
    curve = {1: 0.030, 2: 0.034, 3: 0.040, 4: 0.046, 8: 0.075, 32: 0.280}
    ratios = {1: 0.8, 2: 1.0, 4: 1.1}
    scaled = rescaled(curve, ratios)
    assert scaled[1] == pytest.approx(0.024) and scaled[2] == pytest.approx(0.034)
    assert scaled[3] == pytest.approx(0.040)  # a tie between 2 and 4: the smaller size's ratio
    assert scaled[8] == pytest.approx(0.0825) and scaled[32] == pytest.approx(0.308)
    assert rescaled(curve, {}) is curve and rescaled(None, ratios) is None


def test_calibrate_times_the_loaded_model(tiny_target):
    backend = tiny_target.backend
    saved = backend.step_seconds, backend.step_ratios
    backend.step_seconds = {t: 1.0 + 0.1 * t for t in range(1, 10)}  # a probe far slower than this tiny model
    try:
        ratios = calibrate(backend)
        assert sorted(ratios) == [1, 2, 4] and backend.step_ratios is ratios
        assert all(0 < ratio < 0.5 for ratio in ratios.values())  # a tiny forward takes milliseconds
        timed = planning_curve(backend)
        assert timed[1] == pytest.approx(1.1 * ratios[1]) and timed[9] == pytest.approx(1.9 * ratios[4])
    finally:
        backend.step_seconds, backend.step_ratios = saved


def test_a_context_shorter_than_the_timed_chunks_keeps_the_probe_curve(tiny_target, monkeypatch):
    """A toy config whose context cannot hold the calibration's chunks was an IndexError at load."""
    backend = tiny_target.backend
    monkeypatch.setattr(backend, "step_seconds", {1: 1.0, 2: 1.1})
    short = dataclasses.replace(backend.config, max_position_embeddings=step_calibration.CALIBRATION_CONTEXT + 2)
    monkeypatch.setattr(backend, "config", short)
    monkeypatch.setattr(step_calibration, "time_real_steps", lambda *a, **k: pytest.fail("timed past the context"))
    assert calibrate(backend) == {}


def test_nothing_to_rescale_without_a_probe_curve(tiny_target):
    assert tiny_target.backend.step_seconds is None
    assert calibrate(tiny_target.backend) == {} and tiny_target.backend.step_ratios == {}


def test_loading_a_cpu_execution_mode_with_a_cached_curve_times_the_model(tiny_dirs, monkeypatch):
    """load_model rescales the γ prior of every CPU-mode model whose shape has a cached curve."""
    monkeypatch.setattr(step_costs, "measured_seconds", lambda cfg, mode, max_tokens=9: {1: 2.0, 2: 2.5, 4: 3.0, 8: 4.0})
    timed = []
    original = step_calibration.time_real_steps
    monkeypatch.setattr(step_calibration, "time_real_steps", lambda backend: timed.append(backend) or original(backend))
    model = specdec.load_model(tiny_dirs["target"], quantize="int8")
    assert timed == [model.backend] and sorted(model.backend.step_ratios) == [1, 2, 4]
    assert planning_curve(model.backend)[8] == pytest.approx(4.0 * model.backend.step_ratios[4])


def test_an_explicit_cpu_mode_on_a_fresh_machine_times_its_curve_once(tiny_dirs, tmp_path, monkeypatch, int4_kernel):
    """``--quantize int8`` on a machine with no cached curve used to leave the model unmeasured: seeded
    requests planned on flat costs and a server's ``auto`` policy had no γ per load. Loading now times
    the probe for that mode once and caches it; the next load reads the cache."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.setattr(step_costs, "other_cpu_share", lambda start: 0.0)  # a test neighbour is not "busy"
    model = specdec.load_model(tiny_dirs["target"], quantize="int8")
    assert sorted(model.backend.step_seconds) == list(range(1, 10))
    assert all(seconds > 0 for seconds in model.backend.step_seconds.values())
    assert list((tmp_path / "step_costs").glob("*.json"))

    def must_not_measure(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("a cached curve was measured again")

    monkeypatch.setattr(step_costs, "measure_curves", must_not_measure)
    again = specdec.load_model(tiny_dirs["target"], quantize="int8")
    assert again.backend.step_seconds == model.backend.step_seconds


def test_a_draft_curve_cached_in_a_busy_moment_no_longer_switches_drafting_off(tiny_target, tiny_draft):
    """The failure this fixes: a draft curve timed while the machine was busy (here 4× its real cost)
    makes γ=auto judge that the draft's prompt pass is never paid back, and the request decodes
    plainly. Rescaled by the draft's timed forwards, the same request drafts, a seeded sampled one too (its
    text does not depend on what it drafts: specdec/seeded.py). Output is the plain output."""
    target_seconds = {t: 0.070 + 0.004 * (t - 1) for t in range(1, 10)}  # an int8-like flat curve
    busy_draft = {t: 0.052 * t for t in range(1, 10)}  # 4× the draft it should be (0.013 s a token)
    saved = (tiny_target.backend.step_seconds, tiny_draft.backend.step_seconds, tiny_draft.backend.step_ratios)
    tiny_target.backend.step_seconds, tiny_draft.backend.step_seconds = target_seconds, busy_draft
    prompt = " ".join(["word"] * 13)
    spec = SpecConfig(method="draft_model", num_speculative_tokens="auto")
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    seeded = SamplingParams(temperature=0.8, seed=3, max_tokens=40, ignore_eos=True)
    try:
        plain = specdec.generate(tiny_target, prompt, greedy).token_ids
        busy = specdec.generate(tiny_target, prompt, greedy, draft=tiny_draft, spec=spec)
        tiny_draft.backend.step_ratios = {1: 0.25, 2: 0.25, 4: 0.25}  # what timing the loaded draft says
        timed = specdec.generate(tiny_target, prompt, greedy, draft=tiny_draft, spec=spec)
        seeded_run = specdec.generate(tiny_target, prompt, seeded, draft=tiny_draft, spec=spec)
    finally:
        tiny_target.backend.step_seconds, tiny_draft.backend.step_seconds, tiny_draft.backend.step_ratios = saved
    assert busy.token_ids == plain == timed.token_ids
    assert busy.stats.proposed_tokens == 0 and "not drafting" in busy.stats.speculation_note
    assert timed.stats.proposed_tokens > 0 and not timed.stats.speculation_note
    assert seeded_run.stats.proposed_tokens > 0  # it plans as any request does
    assert seeded_run.token_ids == specdec.generate(tiny_target, prompt, seeded).token_ids
