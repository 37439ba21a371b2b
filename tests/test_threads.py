"""specdec/threads.py: the decode loop runs on the cores other processes leave, and that never changes a bit."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.sampling import SamplingParams
from specdec.threads import ThreadGovernor


def test_a_neighbour_using_half_a_core_or_more_takes_a_thread_away():
    governor = ThreadGovernor(cores=2)
    governor.most = 2
    assert [governor.wanted(share) for share in (0.0, 0.2, 0.24, 0.26, 0.5, 0.9, 1.0)] == [2, 2, 2, 1, 1, 1, 1]
    governor = ThreadGovernor(cores=8)
    governor.most = 4  # never more than it started with
    assert [governor.wanted(share) for share in (0.0, 0.5, 0.75, 1.0)] == [4, 4, 2, 1]


def test_adjust_reads_proc_at_most_every_half_second_and_sets_the_count(monkeypatch):
    import specdec.threads as threads

    shares = iter([0.6, 0.0])
    monkeypatch.setattr(threads, "other_cpu_share", lambda since, now=None: next(shares))
    clock = [100.0]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        governor = ThreadGovernor(cores=2)
        governor.adjust()  # too soon: nothing read
        assert torch.get_num_threads() == 2
        clock[0] += threads.CHECK_EVERY_S
        governor.adjust()  # a neighbour on 1.2 cores: one thread
        assert torch.get_num_threads() == 1
        clock[0] += threads.CHECK_EVERY_S
        governor.adjust()  # gone: back to the two it started with
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)  # the process's own choice (a fixture, a user) is the new most
        clock[0] += threads.CHECK_EVERY_S
        monkeypatch.setattr(threads, "other_cpu_share", lambda since, now=None: 0.0)
        governor.adjust()
        assert torch.get_num_threads() == 1 and governor.most == 1
    finally:
        torch.set_num_threads(before)


def test_a_window_the_process_spent_idle_does_not_take_threads_away(monkeypatch):
    """Between two requests the process is idle while others may run (a peer in `specdec bench`, a finished
    batch job): that window's share said a neighbour held a core, and the next request's prompt pass ran on one
    thread (2x its time to first token). An idle window starts a fresh short one; a long window of the process's
    own work (a long prompt's pass) still counts."""
    import specdec.threads as threads

    clock = [100.0]
    ticks = [(0, 0, 0)]  # (busy ticks of all CPUs, all ticks, this process's ticks)
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(threads, "cpu_ticks", lambda: ticks[0])

    def elapse(seconds: float, others: float, own: float) -> None:  # shares of the machine's 2 cores
        busy, total, mine = ticks[0]
        all_ticks = int(seconds * 200)
        ticks[0] = (busy + int(all_ticks * (others + own)), total + all_ticks, mine + int(all_ticks * own))
        clock[0] += seconds

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        governor = ThreadGovernor(cores=2)
        elapse(5.0, others=1.0, own=0.0)  # idle, while a peer used both cores
        governor.adjust()
        assert torch.get_num_threads() == 2
        elapse(threads.FRESH_LOOK_S, others=0.0, own=1.0)  # the peer has gone; the next look comes soon
        governor.adjust()
        assert torch.get_num_threads() == 2
        elapse(5.0, others=0.6, own=0.4)  # one long forward of ours beside a real neighbour
        governor.adjust()
        assert torch.get_num_threads() == 1
        elapse(5.0, others=1.0, own=0.0)  # idle again: no evidence about now, back to the process's count
        governor.adjust()
        assert torch.get_num_threads() == 2
        elapse(threads.FRESH_LOOK_S, others=0.6, own=0.4)  # the neighbour is still there: found within the short look
        governor.adjust()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("quantize", ["int4", "int8"])
def test_outputs_and_logits_are_the_same_bits_at_one_and_two_threads(tmp_path, int4_kernel, quantize):
    """The governor may change the thread count between any two forwards: the kernels split work by rows and
    heads, never a sum across threads, so every logit is the same bits either way."""
    from specdec.config import SpecConfig
    from tests.conftest import make_tiny_model_dir
    from tests.model_fixtures import TINY_QWEN2_Q4

    target = specdec.load_model(make_tiny_model_dir(tmp_path / "t", TINY_QWEN2_Q4, seed=3), dtype="float32", quantize=quantize)
    draft = specdec.load_model(make_tiny_model_dir(tmp_path / "d", TINY_QWEN2_Q4, seed=4), dtype="float32", quantize=quantize)
    prompt = target.tokenizer.encode("def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)" * 3)
    before = torch.get_num_threads()
    runs = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            state = target.backend.new_state(len(prompt) + 8)
            logits = target.backend.forward(state, prompt, num_logits=len(prompt))
            steps = [target.backend.forward(state, [token]) for token in (5, 9, 11)]  # decode rows
            chunk = target.backend.forward(state, [7, 3, 2, 8])  # a verification chunk
            out = specdec.generate(target, prompt, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
                                   draft=draft, spec=SpecConfig(method="draft_model", num_speculative_tokens=3))
            runs[threads] = (logits, steps, chunk, out.token_ids)
    finally:
        torch.set_num_threads(before)
    (logits1, steps1, chunk1, ids1), (logits2, steps2, chunk2, ids2) = runs[1], runs[2]
    assert torch.equal(logits1, logits2) and torch.equal(chunk1, chunk2)
    assert all(torch.equal(a, b) for a, b in zip(steps1, steps2))
    assert ids1 == ids2


def test_stats_record_the_threads_the_forwards_ran_on(tiny_target, monkeypatch):
    """A tokens/s figure taken while a neighbour held a core ran on fewer threads: the stats say so."""
    import specdec.engine as engine
    from specdec.stats import Stats, aggregate

    counts = iter([2, 2, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])
    monkeypatch.setattr(engine, "adapt_threads", lambda device: next(counts))
    result = specdec.generate(tiny_target, "def f(x):", SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    assert result.stats.threads == (1, 2)
    assert "threads=1-2 (other processes took cores)" in result.stats.summary_line()
    assert result.stats.to_dict()["threads_min"] == 1
    quiet = Stats(threads=(2, 2))
    assert "threads=2" in quiet.summary_line() and "threads_max" in quiet.to_dict() and "threads_min" not in Stats().to_dict()
    assert aggregate([quiet, result.stats])["threads_min"] == 1
