"""--disable-speculation-above read against the recent load (server/policy.py), with a fake clock."""

from __future__ import annotations

import pytest

from specdec.server.policy import LoadAverage, speculation_allowed


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
    assert speculation_allowed(1, 1, one)

    clock2 = Clock()
    two = LoadAverage(clock=clock2)
    # two closed-loop clients: both busy, then one is between requests for a moment
    run(two, clock2, [(2, 3.0), (1, 0.05)], cycles=20)
    assert not speculation_allowed(1, 1, two)  # momentarily alone, but the server is not idle
    assert speculation_allowed(2, 1, two)  # a limit of 2 allows it


def test_the_load_falling_lets_speculation_back_and_none_never_switches_off():
    clock = Clock()
    load = LoadAverage(clock=clock)
    run(load, clock, [(8, 1.0)], cycles=30)
    load.set(1)
    assert not speculation_allowed(1, 1, load)
    clock.now += 30.0  # six time constants of one user
    assert speculation_allowed(1, 1, load)
    assert not speculation_allowed(1, 2, load)  # the count now still counts
    assert speculation_allowed(None, 64, load)
