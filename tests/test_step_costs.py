"""``--quantize auto``: the choice from step-cost curves (synthetic curves: the machine kinds we
have seen), and the measured, cached curves of a tiny shape."""

from __future__ import annotations

import json

import pytest

from specdec.models.config import ModelConfig
from specdec.cost_model import Curve, choose_mode, choose_mode_for_load
from specdec.step_costs import curves_for, plan_execution

# per-step seconds at T = 1, 2, 4, 8, as measured for the 1.5B target (benchmarks/step_cost.py)
AVX2 = {"int8": Curve("int8", {1: 0.067, 2: 0.068, 4: 0.070, 8: 0.075}),
        "int4": Curve("int4", {1: 0.046, 2: 0.056, 4: 0.076, 8: 0.116})}
AVX512_VNNI = {"int8": Curve("int8", {1: 0.0399, 2: 0.0476, 4: 0.0440, 8: 0.0514}),
               "int4": Curve("int4", {1: 0.0269, 2: 0.0338, 4: 0.0515, 8: 0.0883})}

# the probe's curves to 32 rows on a Zen 4 EPYC with AVX-512 VNNI (curve v5, 1.5B target)
VNNI_TO_32 = {"int8": Curve("int8", {1: 0.069, 2: 0.065, 4: 0.066, 8: 0.076, 16: 0.117, 32: 0.187}),
              "int4": Curve("int4", {1: 0.0371, 2: 0.0406, 4: 0.0478, 8: 0.0776, 16: 0.1437, 32: 0.2818})}

TINY = ModelConfig(arch="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                   num_kv_heads=2, head_dim=16, max_position_embeddings=256)


def test_plain_decoding_takes_the_cheapest_single_step():
    assert choose_mode(AVX2).mode == "int4"
    assert choose_mode(AVX512_VNNI).mode == "int4"


def test_a_cheap_well_aligned_draft_moves_the_target_to_the_flat_mode():
    """With acceptance 0.8 and a 3 ms draft step, long drafts pay: the flat int8 verification beats
    int4's cheaper single step, whose chunks grow ~8 ms per token on the VNNI machine."""
    choice = choose_mode(AVX512_VNNI, alpha=0.8, draft_seconds=0.003)
    assert choice.mode == "int8"
    assert choice.rates["int8"] > choice.rates["int4"] and choice.gammas["int8"] >= 3
    assert "chosen: int8" in choice.explain()


def test_a_dear_poorly_aligned_draft_keeps_the_fast_single_step():
    choice = choose_mode(AVX512_VNNI, alpha=0.5, draft_seconds=0.02)
    assert choice.mode == "int4" and choice.gammas["int4"] <= 1


def test_a_server_takes_the_mode_that_serves_its_load_fastest():
    """int4 decodes one request fastest on the VNNI machine, but its extra rows and prompt tokens cost
    ~2× int8's: at 8 concurrent requests int8 served 1.75× int4's total tokens/s there (serve-load
    runs), so a server sized for 8 takes int8 — and one sized for a single user still int4."""
    assert choose_mode(VNNI_TO_32).mode == "int4"
    loaded = choose_mode_for_load(VNNI_TO_32, 8)
    assert loaded.mode == "int8" and loaded.rates["int8"] > 1.2 * loaded.rates["int4"]
    assert "at 8 concurrent requests" in loaded.summary() and "chosen: int8" in loaded.explain()
    assert choose_mode_for_load(VNNI_TO_32, 1).mode == "int4"
    # speculating at that load where it pays: a cheap batched draft on the flat int8 curve
    draft = {1: 0.009, 2: 0.010, 4: 0.012, 8: 0.016, 16: 0.025, 32: 0.045}
    speculating = choose_mode_for_load(VNNI_TO_32, 2, alpha=0.8, draft_step_seconds=draft)
    assert speculating.gammas["int8"] > 0 and speculating.rates["int8"] > choose_mode_for_load(VNNI_TO_32, 2).rates["int8"]


def test_plan_execution_chooses_for_the_servers_concurrency(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    draft = Curve("int4-all", {1: 0.010, 2: 0.011, 4: 0.016, 8: 0.027, 16: 0.051, 32: 0.099})
    monkeypatch.setattr("specdec.step_costs.measure_curves", lambda cfg, modes: {m: VNNI_TO_32.get(m, draft) for m in modes})
    monkeypatch.setattr("specdec.step_costs.cpu_candidates", lambda cfg, modes: modes)
    assert plan_execution(TINY).target_mode == "int4"
    assert plan_execution(TINY, concurrency=8).target_mode == "int8"
    assert plan_execution(TINY, TINY, "draft", concurrency=8).choice.requests == 8


def test_curve_interpolates_and_extends_the_last_slope():
    curve = Curve("x", {1: 1.0, 2: 2.0, 4: 3.0})
    assert curve.cost(3) == pytest.approx(2.5)
    assert curve.cost(6) == pytest.approx(4.0)
    assert curve.cost(1) == 1.0
    assert curve.row_seconds() == pytest.approx(0.5)  # a long prefill's seconds per prompt token


def test_a_curve_never_falls_with_more_rows():
    """Noise can time 32 rows below 16 (a busy minute): extrapolated to 32 requests' drafts, that
    falling slope once gave int8 a negative forward cost and -85.6 expected tokens/s."""
    noisy = Curve("int8", {1: 0.093, 4: 0.104, 8: 0.099, 16: 0.140, 32: 0.120})
    assert noisy.seconds == {1: 0.093, 4: 0.104, 8: 0.104, 16: 0.140, 32: 0.140}
    assert noisy.row_seconds() > 0 and noisy.cost(160) >= noisy.cost(32) > 0
    assert all(noisy.cost(t) <= noisy.cost(t + 1) for t in range(1, 200))
    flat = Curve("int4", {1: 0.0026, 8: 0.0025, 32: 0.0024})  # a tiny model: call overhead only
    assert flat.row_seconds() == pytest.approx(0.0026 / 32)  # never free


def test_one_slow_probe_at_the_largest_size_does_not_price_long_prompts():
    """A neighbour slowed the 32-row probe 13x: its last slope priced a draft's 3k-token catch-up at ~238 s (4.3 s
    measured). A row costs at most the cheapest average per row any size measured."""
    healthy = Curve("int8", {1: 0.012, 2: 0.013, 4: 0.014, 8: 0.020, 16: 0.031, 32: 0.054})
    assert healthy.row_seconds() == pytest.approx((0.054 - 0.031) / 16)  # unchanged: the slope is below 0.054 / 32
    slowed = Curve("int8", {1: 0.012, 2: 0.013, 4: 0.014, 8: 0.020, 16: 0.031, 32: 0.70})
    assert slowed.row_seconds() == pytest.approx(0.031 / 16)
    assert slowed.cost(3000) < 7.0  # 0.70 + 2968 x 1.9 ms (the last slope: 124 s)


def test_curves_are_measured_once_and_cached_per_cpu(tmp_path, monkeypatch, int4_kernel):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.setattr("specdec.step_costs.other_cpu_share", lambda since: 0.0)  # a busy neighbour would skip the cache
    first = curves_for(TINY, ("int8", "int4"))
    assert set(first) == {"int8", "int4"}
    assert all(seconds > 0 for curve in first.values() for seconds in curve.seconds.values())
    (saved,) = (tmp_path / "step_costs").glob("*.json")
    assert "int4" in next(iter(json.loads(saved.read_text()).values()))

    def must_not_measure(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("a cached curve was measured again")

    monkeypatch.setattr("specdec.step_costs.measure_curves", must_not_measure)
    again = curves_for(TINY, ("int8", "int4"))
    assert {m: c.seconds for m, c in again.items()} == {m: c.seconds for m, c in first.items()}


def test_a_kernel_change_measures_the_curves_again(tmp_path, monkeypatch):
    """Curves are keyed by the C++ kernels' build: a new build (a kernel edit) must not be planned with
    the old build's costs, and going back to a build finds its own curves again; so is a kernel path
    other than the CPU's best (its chunks cost what they cost there), another 4-bit AMX threshold, and
    weights on 4 KiB pages."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.setattr("specdec.step_costs.amx_key", lambda: "")  # (a CPU without AMX; the default threshold)
    monkeypatch.setattr("specdec.step_costs.huge_pages_supported", lambda: True)
    measured = []

    def fake_measure(cfg, modes):  # noqa: ANN001, ANN202
        measured.append(modes)
        scale = len(measured)
        return {mode: Curve(mode, {1: 0.01 * scale, 2: 0.011 * scale, 4: 0.013 * scale, 8: 0.02 * scale})
                for mode in modes}

    monkeypatch.setattr("specdec.step_costs.measure_curves", fake_measure)
    monkeypatch.setattr("specdec.step_costs.other_cpu_share", lambda start: 0.0)
    monkeypatch.setattr("specdec.step_costs.unsupported_reason", lambda: None)
    monkeypatch.setattr("specdec.step_costs.kernels_available", lambda: True)
    monkeypatch.setattr("specdec.step_costs.kernel_paths", lambda: ["avx512-vnni", "avx2"])
    monkeypatch.setattr("specdec.step_costs.kernel_path", lambda: "avx512-vnni")
    monkeypatch.setattr("specdec.step_costs.build_key", lambda: "aaaaaaaaaaaa")
    old_build = curves_for(TINY, ("int4",))["int4"].cost(1)
    monkeypatch.setattr("specdec.step_costs.build_key", lambda: "bbbbbbbbbbbb")
    new_build = curves_for(TINY, ("int4",))["int4"].cost(1)
    assert len(measured) == 2 and new_build != old_build
    monkeypatch.setattr("specdec.step_costs.build_key", lambda: "aaaaaaaaaaaa")
    assert curves_for(TINY, ("int4",))["int4"].cost(1) == old_build and len(measured) == 2
    assert sorted(p.name.rsplit("-k", 1)[1] for p in (tmp_path / "step_costs").glob("*.json")) == [
        "aaaaaaaaaaaa.json", "bbbbbbbbbbbb.json"]
    # a path other than the CPU's best (SPECDEC_KERNEL_PATH=avx2) has its own curves, the best path keeps its file
    monkeypatch.setattr("specdec.step_costs.kernel_path", lambda: "avx2")
    assert curves_for(TINY, ("int4",))["int4"].cost(1) != old_build and len(measured) == 3
    assert len(list((tmp_path / "step_costs").glob("*-kaaaaaaaaaaaa-avx2.json"))) == 1
    # SPECDEC_Q4_AMX_ROWS moves int4 chunks' costs: its own curves too
    monkeypatch.setattr("specdec.step_costs.kernel_path", lambda: "avx512-vnni")
    monkeypatch.setattr("specdec.step_costs.amx_key", lambda: "-amx0")
    assert curves_for(TINY, ("int4",))["int4"].cost(1) != old_build and len(measured) == 4
    assert len(list((tmp_path / "step_costs").glob("*-kaaaaaaaaaaaa-amx0.json"))) == 1
    # models on 4 KiB pages (SPECDEC_HUGE_PAGES=0, or no transparent huge pages) stream slower: their own curves
    monkeypatch.setattr("specdec.step_costs.huge_pages_supported", lambda: False)
    assert curves_for(TINY, ("int4",))["int4"].cost(1) != old_build and len(measured) == 5
    assert len(list((tmp_path / "step_costs").glob("*-kaaaaaaaaaaaa-amx0-4k.json"))) == 1


def test_plan_names_a_mode_for_target_and_draft(tmp_path, monkeypatch, int4_kernel):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    plan = plan_execution(TINY, TINY, "draft")
    assert plan.target_mode in ("int8", "int4") and plan.draft_mode in ("int8", "int4-all")
    assert "chosen:" in plan.explain() and "draft step" in plan.explain()
    assert plan_execution(TINY).target_mode in ("int8", "int4")


def test_a_curve_timed_on_a_busy_machine_is_not_cached(tmp_path, monkeypatch):
    """A probe timed while other processes held the cores reads far below memory bandwidth: it is
    used for this run but measured again next time, never cached as this machine's truth."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    slow = {"int8": Curve("int8", {1: 1.2, 2: 1.3, 4: 1.5, 8: 1.6}, gb_per_s=1.3, weight_gb=1.6),
            "int4": Curve("int4", {1: 1.1, 2: 1.2, 4: 1.4, 8: 1.5}, gb_per_s=0.9, weight_gb=1.0)}
    calls = []
    monkeypatch.setattr("specdec.step_costs.measure_curves", lambda cfg, modes: calls.append(modes) or slow)
    assert curves_for(TINY, ("int8", "int4"))["int4"].cost(1) == 1.1
    curves_for(TINY, ("int8", "int4"))  # the same run: kept (a busy machine probed it once per model of a generate)
    assert len(calls) == 1 and not (tmp_path / "step_costs").exists()
    monkeypatch.setattr("specdec.step_costs._RUN_ONLY", {})  # the next run
    curves_for(TINY, ("int8", "int4"))
    assert len(calls) == 2 and not (tmp_path / "step_costs").exists()


def test_a_curve_timed_while_other_processes_ran_is_not_cached(tmp_path, monkeypatch):
    """Other processes' CPU time during the probe (or a hypervisor's steal) is contention, not this
    machine: the curve serves this run and is measured again next time."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    calls = []
    quiet = {m: Curve(m, {1: 0.03, 2: 0.04}, gb_per_s=25, weight_gb=1.0) for m in ("int8", "int4")}
    monkeypatch.setattr("specdec.step_costs.measure_curves", lambda cfg, modes: calls.append(modes) or quiet)
    monkeypatch.setattr("specdec.step_costs.other_cpu_share", lambda since: 0.5)
    curves_for(TINY, ("int8", "int4"))
    assert not (tmp_path / "step_costs").exists()
    monkeypatch.setattr("specdec.step_costs.other_cpu_share", lambda since: 0.02)
    monkeypatch.setattr("specdec.step_costs._RUN_ONLY", {})  # the next run
    curves_for(TINY, ("int8", "int4"))
    curves_for(TINY, ("int8", "int4"))
    assert len(calls) == 2 and (tmp_path / "step_costs").exists()


def test_other_processes_cpu_share_is_read_from_proc():
    import os
    import subprocess
    import sys
    import time

    from specdec.cpu import cpu_ticks, other_cpu_share

    start = cpu_ticks()
    if start is None:
        pytest.skip("no /proc here")
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 1.0\nwhile time.time() < end: pass"])
    busy.wait()
    assert other_cpu_share(start) > 0.3 / (os.cpu_count() or 1)  # one of this machine's cores, busy for a second
    # this process's own work is not "others": measured against the others' share while it sleeps (a fixed
    # bound failed on a machine other sessions kept busy); counted, one busy core would add 1/cores
    since = cpu_ticks()
    time.sleep(0.4)
    idle = other_cpu_share(since)
    since = cpu_ticks()
    end = time.perf_counter() + 0.4
    while time.perf_counter() < end:
        pass
    assert other_cpu_share(since) < idle + 0.6 / (os.cpu_count() or 1)


def test_plan_knows_the_plain_choice_from_the_same_curves():
    """--compare-plain times our best plain decoding: the mode auto picks for plain decoding can differ
    from the one it picks for a speculative target, and comes from the same measured curves."""
    from specdec.step_costs import ExecutionPlan

    choice = choose_mode(AVX512_VNNI, alpha=0.8, draft_seconds=0.003)
    plan = ExecutionPlan(choice.mode, "int4-all", choice)
    assert (plan.target_mode, plan.plain_mode) == ("int8", "int4")
    assert ExecutionPlan("int8").plain_mode == "int8"  # one candidate: nothing else to pick


def test_the_draft_step_is_timed_with_the_vocabulary_it_scores(tmp_path, monkeypatch):
    """--draft-vocab-size cuts the draft's LM head (a quarter of a 0.5B model's bytes at 152k
    tokens): its step is measured for that head, not the full one."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    seen = []

    def fake(cfg, modes):  # noqa: ANN001, ANN202
        seen.append(cfg.vocab_size)
        # the modes far apart: no close call to time again (test_a_close_choice_times_…)
        return {m: Curve(m, {t: s * (3 if m == "int8" else 1) for t, s in {1: 0.01, 2: 0.011, 4: 0.012, 8: 0.02}.items()},
                         gb_per_s=20, weight_gb=0.05) for m in modes}

    monkeypatch.setattr("specdec.step_costs.measure_curves", fake)
    monkeypatch.setattr("specdec.step_costs.cpu_candidates", lambda cfg, modes: modes)
    plan_execution(TINY, TINY, "draft", draft_vocab=128)
    assert 128 in seen and seen.count(TINY.vocab_size) == 1  # the target keeps its own vocabulary


def test_the_probe_scales_layers_and_head_apart(int4_kernel):
    """The probe times a step without layers, the layers and the head apart: a deeper model costs
    more per added layer, and a bigger vocabulary adds head time, never the fixed per-step cost."""
    from specdec.step_probe import measure_curves

    shallow = measure_curves(TINY, ("int4",), repeats=3)["int4"]
    deep = measure_curves(ModelConfig(**{**TINY.__dict__, "num_layers": 40}), ("int4",), repeats=3)["int4"]
    assert deep.cost(1) > shallow.cost(1) and deep.weight_gb > 5 * shallow.weight_gb


def test_batch_speculation_limit_follows_the_measured_curve():
    from specdec.cost_model import batch_gammas, batch_speculation_limit

    steep = {1: 0.075, 2: 0.076, 4: 0.080, 8: 0.105}  # AVX2 int8 1.5B, measured: rows cost beyond 8
    draft = {1: 0.013, 2: 0.018, 4: 0.0245, 8: 0.047}  # AVX2 int4-all 0.5B, measured
    # alone the best γ; shorter drafts as requests share forwards; none once verification rows cost too much
    assert batch_gammas(steep, 0.7, 4, draft, 6) == {1: 3, 2: 1, 3: 1, 4: 1, 5: 0, 6: 0}
    assert batch_gammas(steep, 0.7, 4, {1: 0.013}, 6) == {1: 3, 2: 1, 3: 0, 4: 0, 5: 0, 6: 0}  # unbatched draft rows
    assert batch_gammas(steep, 0.9, 2, draft, 3)[1] == 2  # never above the requests' own γ
    assert batch_speculation_limit(steep, 0.7, 4, draft, 16) == 4
    flat = {1: 0.075, 2: 0.075, 4: 0.076, 8: 0.077, 16: 0.080, 32: 0.090, 64: 0.120}  # a flat (GPU-like) curve
    assert batch_speculation_limit(flat, 0.7, 4, None, 16) == 16
    assert batch_gammas(flat, 0.7, 4, None, 16)[16] == 3  # 16·5 rows start to cost: shorter drafts
    assert batch_speculation_limit(steep, 0.0, 4, None, 16) == 0  # nothing is ever accepted: never
    assert batch_speculation_limit(None, 0.7, 4, None, 16) is None  # unmeasured: nothing switched off

def test_the_drafts_pass_over_new_prompts_is_a_cost_of_speculating_under_load():
    """Under load every new request's prompt is read by the draft model too: work plain decoding never
    does. Where rows are cheap (AMX int8: 8 requests' rows cost little more than one) it decides: γ=1
    at 8 concurrent ran 0.91-0.94x speculation off on a 2-core Xeon, and the table without it chose 1."""
    from specdec.cost_model import batch_gammas

    amx_int8 = {1: 0.0657, 2: 0.0731, 4: 0.0744, 8: 0.0776, 16: 0.0866, 32: 0.1104}  # 1.5B, measured
    draft = {1: 0.0235, 2: 0.025, 4: 0.0325, 8: 0.0415, 16: 0.0738, 32: 0.1291}  # 0.5B int4-all, probe
    without = batch_gammas(amx_int8, 0.75, None, draft, 8)
    with_prompts = batch_gammas(amx_int8, 0.75, None, draft, 8, draft_prompt_s_per_token=0.0009)  # 0.9 ms a row, 1 a token
    assert without[1] > 0 and with_prompts[1] > 0  # alone it pays either way
    assert (without[8], with_prompts[8]) == (1, 0)
    assert all(with_prompts[n] <= without[n] for n in without)  # an added cost never lengthens drafts


def test_cache_sizes_are_read_from_sysfs(tmp_path):
    """The probe evicts twice the largest cache before each timed forward; its size comes from sysfs."""
    from specdec.cpu import DEFAULT_LAST_LEVEL_CACHE, last_level_cache_bytes, parse_cache_size

    assert parse_cache_size("32768K\n") == 32 * 2**20
    assert parse_cache_size("2M") == 2 * 2**20
    assert parse_cache_size("512") == 512
    with pytest.raises(ValueError):
        parse_cache_size("lots")
    for index, size in enumerate(("48K", "2048K", "32768K", "junk")):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size)
    assert last_level_cache_bytes(tmp_path) == 32 * 2**20
    assert last_level_cache_bytes(tmp_path / "missing") == DEFAULT_LAST_LEVEL_CACHE


def test_the_probe_times_weights_read_from_memory(monkeypatch, int4_kernel):
    """Every timed probe forward follows an eviction of at least twice the last-level cache (a warm
    probe timed cache reads: T=1 29 ms against 38 in the real model on a Zen 4 EPYC)."""
    from specdec import step_probe
    from specdec.cpu import last_level_cache_bytes

    buffer = step_probe._cache_evictor().__closure__[0].cell_contents
    assert buffer.numel() * buffer.element_size() >= 2 * last_level_cache_bytes()
    evictions, timed = [], []
    monkeypatch.setattr(step_probe, "_cache_evictor", lambda: lambda: evictions.append(len(timed)))
    real_clock = step_probe.time.perf_counter

    def clock():
        timed.append(len(evictions))
        return real_clock()

    monkeypatch.setattr(step_probe.time, "perf_counter", clock)
    step_probe.measure_curves(TINY, ("int4",), repeats=1)
    starts = timed[0::2]  # each forward reads the clock twice: start, end
    # (warm-up + 1 repeat) × chunk sizes × 3 parts, each started right after its own eviction
    assert len(evictions) == len(starts) == 2 * len(step_probe.CHUNK_SIZES) * 3
    assert starts == list(range(1, len(evictions) + 1))


def _curves(int8: float, int4: float) -> dict[str, Curve]:
    """Flat-ish curves whose single step costs ``int8`` / ``int4`` seconds."""
    return {"int8": Curve("int8", {1: int8, 2: int8 * 1.01, 4: int8 * 1.04, 8: int8 * 1.4}, gb_per_s=40, weight_gb=1.5),
            "int4": Curve("int4", {1: int4, 2: int4 * 1.05, 4: int4 * 1.5, 8: int4 * 2.5}, gb_per_s=30, weight_gb=1.0)}


def test_a_close_choice_times_the_candidates_again_and_keeps_the_minimum(tmp_path, monkeypatch):
    """A probe from a minute of memory contention (which /proc/stat does not show) made int8 look
    dear; plain decoding's choice was within 15 %, so the candidates are timed again on plans at
    least PROBE_SPACING_S apart, each size keeping its minimum, up to MAX_PROBES probes — then never
    again for that build."""
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    clock = [1000.0]
    monkeypatch.setattr("specdec.step_costs.time.time", lambda: clock[0])
    monkeypatch.setattr("specdec.step_costs.cpu_candidates", lambda cfg, modes: modes)
    monkeypatch.setattr("specdec.step_costs.other_cpu_share", lambda since: 0.0)
    probes = [_curves(0.040, 0.036), _curves(0.032, 0.0355), _curves(0.045, 0.034)]
    calls = []
    monkeypatch.setattr("specdec.step_costs.measure_curves", lambda cfg, modes: calls.append(modes) or probes.pop(0))
    plan = plan_execution(TINY)  # the contended probe; close (0.036 vs 0.040), but timed just now
    assert len(calls) == 1 and plan.target_mode == "int4"
    clock[0] += 60
    plan_execution(TINY)
    assert len(calls) == 1  # a minute later: the same minute of the machine, as far as we know
    clock[0] += 600
    plan = plan_execution(TINY)  # ten minutes later: timed again, the quiet probe decides
    assert len(calls) == 2 and plan.target_mode == "int8"
    assert plan.choice.curves["int8"].cost(1) == pytest.approx(0.032)
    clock[0] += 600
    plan = plan_execution(TINY)  # still close (0.032 vs 0.0355): a third probe, minimum kept per size
    assert len(calls) == 3 and plan.target_mode == "int8"
    assert plan.choice.curves["int4"].cost(1) == pytest.approx(0.034)
    assert plan.choice.curves["int8"].cost(1) == pytest.approx(0.032)
    saved = json.loads(next((tmp_path / "step_costs").iterdir()).read_text())
    assert next(iter(saved.values()))["_probes"] == {"int8": 3, "int4": 3}
    clock[0] += 600
    plan_execution(TINY)  # MAX_PROBES reached: the cache decides
    assert len(calls) == 3


def test_a_clear_choice_is_not_timed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.setattr("specdec.step_costs.cpu_candidates", lambda cfg, modes: modes)
    monkeypatch.setattr("specdec.step_costs.other_cpu_share", lambda since: 0.0)
    calls = []
    monkeypatch.setattr("specdec.step_costs.measure_curves", lambda cfg, modes: calls.append(modes) or _curves(0.060, 0.030))
    assert plan_execution(TINY).target_mode == "int4"
    assert plan_execution(TINY).target_mode == "int4"
    assert len(calls) == 1


def test_a_busy_second_probe_leaves_the_cache_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.setattr("specdec.step_costs.cpu_candidates", lambda cfg, modes: modes)
    shares = [0.0, 0.5]  # the first probe quiet, the second while other processes ran
    monkeypatch.setattr("specdec.step_costs.other_cpu_share", lambda since: shares.pop(0))
    probes = [_curves(0.040, 0.036), _curves(0.001, 0.001)]
    monkeypatch.setattr("specdec.step_costs.measure_curves", lambda cfg, modes: probes.pop(0))
    clock = [1000.0]
    monkeypatch.setattr("specdec.step_costs.time.time", lambda: clock[0])
    plan_execution(TINY)
    clock[0] += 600
    plan = plan_execution(TINY)
    assert not probes  # timed again, while busy
    clock[0] += 600
    probes.append(_curves(0.002, 0.002))
    plan_execution(TINY)  # not again in this run: nothing was cached, so the spacing did not stop a bench per method
    assert len(probes) == 1
    assert plan.target_mode == "int4" and plan.choice.curves["int8"].cost(1) == pytest.approx(0.040)
    saved = json.loads(next((tmp_path / "step_costs").iterdir()).read_text())
    assert next(iter(saved.values()))["int8"]["1"] == pytest.approx(0.040)


def test_explain_points_at_tune_where_another_mode_verifies_long_drafts_nearly_free():
    """int8 on AMX tiles verifies 9 tokens for ~1.2 single steps while int4 pays ~2.6: the choice (made
    with one α) stays int4, and --explain says that int8 may be faster where drafts are accepted in runs."""
    from specdec.cost_model import choose_mode, flat_verification_note

    curves = {"int8": Curve("int8", {1: 0.068, 4: 0.075, 9: 0.080}), "int4": Curve("int4", {1: 0.0465, 4: 0.0655, 9: 0.120})}
    speculating = choose_mode(curves, 0.8, 0.023)
    assert speculating.mode == "int4"
    note = flat_verification_note(speculating)
    assert note is not None and note.startswith("int8 verifies 9 tokens for 1.18×") and "specdec tune" in note
    assert flat_verification_note(choose_mode(curves)) is None  # plain decoding: nothing to verify
    steep = {"int8": Curve("int8", {1: 0.068, 9: 0.140}), "int4": curves["int4"]}
    assert flat_verification_note(choose_mode(steep, 0.8, 0.023)) is None
    free = choose_mode(curves, 0.99, 0.0)  # a table drafter accepted nearly always: the flat mode is chosen itself
    assert free.mode == "int8" and flat_verification_note(free) is None
