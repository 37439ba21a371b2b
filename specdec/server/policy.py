"""When a server request may speculate: ``--disable-speculation-above N`` read against the load.

Why not just the number of active requests at this instant: under a steady load of closed-loop
clients a request often starts while it is momentarily alone (its neighbour's client is between
requests). It then speculates, its draft model pays a pass over the whole prompt, and the next
arrival switches it off again: measured at 2/4/8 concurrent clients on the default pair, speculation-on
requests ran at 0.96/0.89/0.93× plain (benchmarks/results/2026-11-25/serve-load-auto.md). So the
limit (and the γ per number of requests under ``auto``) is read against the larger of the count now and a time-weighted average of recent counts
(:class:`LoadAverage`, active plus waiting requests, time constant a few requests long): one user's
requests back to back stay at ≤ 1 and speculate; two users' average ~2 and do not, even in the
gaps between their requests.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable

from specdec.adaptive import PRIOR_TRIALS, TRIALS_TO_JUDGE, acceptance_trials

#: seconds over which the load average forgets (a few requests' length on a CPU)
LOAD_TIME_CONSTANT_S = 5.0


class LoadAverage:
    """Time-weighted exponential average of a count that changes at discrete moments (requests in
    the server): each value counts for as long as it was held. Thread-safe (the event loop moves the
    count, the model thread asks)."""

    def __init__(self, time_constant_s: float = LOAD_TIME_CONSTANT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.time_constant_s = time_constant_s
        self.clock = clock
        self._lock = threading.Lock()
        self._count = 0
        self._average = 0.0
        self._since = clock()

    def _advance(self, now: float) -> None:
        held = max(0.0, now - self._since)
        weight = math.exp(-held / self.time_constant_s)
        self._average = self._average * weight + self._count * (1.0 - weight)
        self._since = now

    def set(self, count: int) -> None:
        """The count changed to ``count`` now."""
        with self._lock:
            self._advance(self.clock())
            self._count = count

    def value(self) -> float:
        with self._lock:
            self._advance(self.clock())
            return self._average


def requests_now(active: int, load: LoadAverage) -> int:
    """The requests a new one shares forwards with, itself included: the larger of those active now
    and the recent average (rounded: 1.4 is one user with some overlap, 1.6 is two)."""
    return max(1, active, math.floor(load.value() + 0.5))


def speculation_cap(limit: int | None, gammas: dict[int, int] | None, active: int, load: LoadAverage) -> int | None:
    """The most tokens a request may draft now: 0 none, None no cap. Over ``limit`` requests
    (:func:`requests_now`; None: never) nothing is drafted; else, sharing forwards with others,
    ``gammas`` (γ per number of requests from a prior α, cost_model.batch_gammas; None: no cap)
    says how much."""
    requests = requests_now(active, load)
    if limit is not None and requests > limit:
        return 0
    if gammas is None or requests == 1:  # alone, the request's own γ (its controller knows its α)
        return None
    return gammas.get(requests, 0)


class AcceptanceMeter:
    """α of the server's own traffic, from its finished requests' rounds: accepted tokens over
    acceptance trials (adaptive.acceptance_trials, as a request's own γ controller counts them), as
    running sums that forget older requests (``decay`` per request). Starts from ``prior`` worth of
    PRIOR_TRIALS trials, so the first requests move it quickly. The γ per number of requests under load
    (:class:`GammaTable`) is computed with it: the prior α 0.7 is a code drafter's, chat traffic
    was measured far lower, and speculating at it under load lost throughput."""

    def __init__(self, prior: float = 0.7, decay: float = 0.8) -> None:
        self.decay = decay
        self._lock = threading.Lock()
        self._accepted, self._trials = PRIOR_TRIALS * prior, PRIOR_TRIALS
        self._observed = 0  # acceptance trials seen in all (not decayed)

    def observe(self, rounds: list) -> None:  # noqa: ANN401 - specdec.stats.Round objects
        accepted = sum(r.accepted for r in rounds if r.drafted)
        trials = sum(acceptance_trials(len(r.drafted), r.accepted) for r in rounds if r.drafted)
        if not trials:
            return
        with self._lock:
            self._accepted = self.decay * self._accepted + accepted
            self._trials = self.decay * self._trials + trials
            self._observed += trials

    @property
    def measured(self) -> bool:
        """Whether α rests on traffic (enough trials to judge a drafter) rather than on the prior: a
        request's own controller plans optimistically until then (specdec.adaptive.OPTIMISTIC_ALPHA)."""
        with self._lock:
            return self._observed >= TRIALS_TO_JUDGE

    @property
    def alpha(self) -> float:
        with self._lock:
            return self._accepted / self._trials


class GammaTable:
    """γ per number of concurrent requests for an α (cost_model.batch_gammas over the measured
    curves), recomputed when α moves by a step of 0.05; and what speculating saves per token at a
    load (cost_model.batch_saving_per_token: a new request's draft prompt pass must repay it)."""

    def __init__(self, gammas_for: Callable[[float], dict[int, int] | None],
                 saving_for: Callable[[float, int], float] | None = None) -> None:
        self.gammas_for = gammas_for
        self.saving_for = saving_for
        self._cache: dict[float, dict[int, int] | None] = {}

    @staticmethod
    def _key(alpha: float) -> float:
        return round(min(max(alpha, 0.0), 0.99) * 20) / 20

    def for_alpha(self, alpha: float) -> dict[int, int] | None:
        key = self._key(alpha)
        if key not in self._cache:
            self._cache[key] = self.gammas_for(key)
        return self._cache[key]

    def saving(self, alpha: float, requests: int) -> float | None:
        """Forward seconds per token speculating saves with ``requests`` sharing forwards (None: unknown)."""
        return None if self.saving_for is None else self.saving_for(self._key(alpha), requests)
