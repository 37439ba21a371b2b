"""When a server request may speculate: ``--disable-speculation-above N`` read against the load.

Why not just the number of active requests at this instant: under a steady load of closed-loop
clients a request often starts while it is momentarily alone (its neighbour's client is between
requests). It then speculates, its draft model pays a pass over the whole prompt, and the next
arrival switches it off again: measured at 2/4/8 concurrent clients on the default pair, speculation-on
requests ran at 0.96/0.89/0.93× plain (benchmarks/results/2026-11-25/serve-load-auto.md). So the
limit is read against the larger of the count now and a time-weighted average of recent counts
(:class:`LoadAverage`, active plus waiting requests, time constant a few requests long): one user's
requests back to back stay at ≤ 1 and speculate; two users' average ~2 and do not, even in the
gaps between their requests.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable

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


def speculation_allowed(limit: int | None, active: int, load: LoadAverage) -> bool:
    """``limit`` (None: never switched off) against the requests active now and the recent average
    (rounded: an average of 1.4 is one user with some overlap, 1.6 is two)."""
    return limit is None or max(active, math.floor(load.value() + 0.5)) <= limit
