"""What the batched forwards of a server (or of the offline batch API) really cost in this process.

The load policy (:mod:`specdec.policy`) chooses γ per number of requests from step-cost curves: the
probe's, rescaled by a few timed forwards of *one* sequence after loading
(:mod:`specdec.step_calibration`). A batched decode forward is N sequences, each with its own cache
and positions, and costs more than an N-token chunk of one sequence. Measured in a server on a 2-core
Xeon with AMX (int8 1.5B target, int4-all 0.5B draft, 8 concurrent chat requests, session 35): the
draft model's forward of 1 / 4 / 8 requests took 14.8 / 24.6 / 36.2 ms against the curve's 9.8 / 16.4 /
22.1 (1.5–1.6×), the target's 8 / 16 / 32 rows 86 / 91 / 118 ms against 72 / 79 / 96 (1.1–1.2×). From
the curves the policy expected γ≥1 at 8 requests to gain 7–38 %; speculation ran at 0.85–0.94× plain.

So every decode forward the scheduler runs is timed here (:class:`Forward`), and the policy's curves
are rescaled by the median of each size's recent forwards (:meth:`ForwardCosts.ratios`): after a
few forwards at a load, the table is built from what that load costs on this machine. Forwards that
carry a prompt pass are left out (they are compute-bound, another curve), and so are a draft model's
catch-up passes over a prompt (many rows for one request).
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from dataclasses import dataclass
from typing import Literal

from specdec.cost_model import Curve

#: recent forwards per size whose median is taken (a few seconds of a server's steps)
WINDOW = 16
#: forwards of a size seen before its cost replaces the curve's
MIN_SAMPLES = 3
#: a forward of a model with more rows than this many per request was a catch-up pass, not a step
STEP_ROWS_PER_REQUEST = 2


@dataclass(frozen=True)
class Forward:
    """One batched forward the scheduler ran (:class:`specdec.scheduler.Batcher`)."""

    backend: object  # the model that ran it (its Backend)
    role: Literal["target", "draft"]
    requests: int
    rows: int
    prompt_calls: int  # calls in it that were prompt passes (or prefill chunks)
    seconds: float
    prompt_rows: int = 0  # the rows of those calls: prompt tokens computed (a prefix cache's hits are not)
    #: times the weights were read: once where the backend batches its calls, else once per call
    weight_passes: int = 1


class ForwardCosts:
    """Recent seconds of decode forwards per model, by rows (a target: its cost follows its rows) and
    by requests (a draft model: one or two rows each). Thread-safe: the model thread observes, the
    policy reads on the same thread or the event loop's."""

    def __init__(self, window: int = WINDOW, min_samples: int = MIN_SAMPLES) -> None:
        self.window = window
        self.min_samples = min_samples
        self._lock = threading.Lock()
        self._seconds: dict[tuple[int, str, int], deque[float]] = {}
        self._observed = 0

    def observe(self, forward: Forward) -> None:
        """Record a forward (one without prompt passes; others are ignored)."""
        if forward.prompt_calls or forward.rows <= 0:
            return
        keys = [(id(forward.backend), "rows", forward.rows)]
        if forward.rows <= STEP_ROWS_PER_REQUEST * forward.requests:
            keys.append((id(forward.backend), "requests", forward.requests))
        with self._lock:
            for key in keys:
                self._seconds.setdefault(key, deque(maxlen=self.window)).append(forward.seconds)
            self._observed += 1

    @property
    def observed(self) -> int:
        """Forwards recorded so far: what is measured changes only when this does (readers cache by it)."""
        with self._lock:
            return self._observed

    def measured(self, backend: object, per: Literal["rows", "requests"]) -> dict[int, float]:
        """Median seconds of ``backend``'s recent forwards per size (rows or requests), for sizes seen
        at least ``min_samples`` times."""
        with self._lock:
            return {size: statistics.median(seconds) for (owner, kind, size), seconds in self._seconds.items()
                    if owner == id(backend) and kind == per and len(seconds) >= self.min_samples}

    def ratios(self, backend: object, curve: dict[int, float], per: Literal["rows", "requests"]) -> dict[int, float]:
        """Measured ÷ ``curve`` at each measured size ({} where none is): what
        :func:`specdec.step_calibration.rescaled` multiplies the curve by."""
        planned = Curve("planned", dict(curve))
        return {size: seconds / planned.cost(size) for size, seconds in self.measured(backend, per).items()}


def at_most_larger(curve: dict[int, float]) -> dict[int, float]:
    """``curve`` (size → seconds) with each size's cost held at or below every larger size's. Timing
    noise in a server is one-sided: a forward slowed by other work on the cores (a request's HTTP and
    tokenizing while another finishes) never runs faster. Rescaled by such a slow small size, the curve
    (which :class:`~specdec.cost_model.Curve` keeps non-decreasing) priced every larger size at it:
    measured on a 2-core AMX Xeon, 7-request forwards at 1.24x their curve during request turnover made 8
    and 16 target rows cost the same, and the γ table drafted at 8 concurrent chat requests (0.85x
    speculation off)."""
    capped, least = {}, math.inf
    for size, seconds in sorted(curve.items(), reverse=True):
        least = min(least, seconds)
        capped[size] = least
    return dict(sorted(capped.items()))
