"""Intra-op threads that step aside when other processes take cores.

Why: torch's OpenMP threads (and the C++ kernels' ``at::parallel_for`` regions) meet at a barrier many
times per forward. When another process holds one of the cores, the thread that shares it with that
process reaches each barrier a scheduler time slice late, and every forward waits for it. Measured on
2 cores with one busy neighbour (``yes > /dev/null``), SmolLM2-135M int4, 48 tokens: 2 threads
**9–21 tok/s**, 1 thread **115 tok/s**; quiet, 2 threads 189. So the decode loop asks, at most every
:data:`CHECK_EVERY_S`, how many cores other processes used since the last look (``/proc/stat``) and
runs on the cores left, never more threads than the process chose (its own ``torch.set_num_threads``).

Exactness does not depend on it: the kernels split work by output rows and heads, never a sum across
threads, so a token's logits are the same bits at any thread count (``tests/test_threads.py``).
``SPECDEC_ADAPT_THREADS=0`` turns it off.
"""

from __future__ import annotations

import os
import time

import torch

from specdec.cpu import cpu_ticks, other_cpu_share

#: seconds between two looks at /proc/stat (a look costs ~20 µs; a decode step, milliseconds)
CHECK_EVERY_S = 0.5
#: a window longer than this since the last look, in which the process ran less than half a core, spans time
#: it spent idle (between requests): what others did then is not what they do now, so the governor starts a
#: fresh window of :data:`FRESH_LOOK_S` (a long window of its own work — a long prompt's pass — still counts)
STALE_AFTER_S = 2 * CHECK_EVERY_S
#: the first window after an idle spell: short, so a neighbour that is really there costs at most this long on
#: too many threads (/proc/stat counts in 10 ms ticks: 20 of them on 2 cores, a 5 % resolution)
FRESH_LOOK_S = 0.1


class ThreadGovernor:
    """Sets torch's intra-op thread count to the cores other processes left free, between forwards
    (call :meth:`adjust` on the thread that runs the model: OpenMP's count is per calling thread)."""

    def __init__(self, cores: int | None = None) -> None:
        self.cores = cores or os.cpu_count() or 1
        #: the thread count the process chose (at the first look, or set since by someone else): never exceeded
        self.most: int | None = None
        self._set: int | None = None  # the count this governor last set
        self._since = cpu_ticks()
        self._looked = time.monotonic()  # when _since was read
        self._next = self._looked + CHECK_EVERY_S

    def wanted(self, other_share: float) -> int:
        """Threads for the cores others left: a neighbour using half a core or more takes one away."""
        assert self.most is not None
        free = self.cores * (1.0 - other_share)
        return max(1, min(self.most, int(free + 0.5)))

    def idle_between(self, since: tuple[int, int, int] | None, now: tuple[int, int, int] | None) -> bool:
        """Did this process run less than half a core between two :func:`cpu_ticks` readings?"""
        if since is None or now is None or now[1] <= since[1]:
            return True
        return (now[2] - since[2]) < 0.5 * (now[1] - since[1]) / self.cores

    def adjust(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        current = torch.get_num_threads()
        if current != self._set:  # the first look, or the process set its own count since
            self.most = current
        ticks = cpu_ticks()
        if now - self._looked > STALE_AFTER_S and self.idle_between(self._since, ticks):
            # the window spans an idle spell: a peer benchmarked between two of our requests (or a batch job that
            # has since finished) read as a neighbour taking a core now, and the next request's prompt pass ran
            # on one thread — 2x its time to first token (`specdec bench` beside llama.cpp). Look again shortly.
            threads, self._next = self.most, now + FRESH_LOOK_S
        else:
            threads, self._next = self.wanted(other_cpu_share(self._since, ticks)), now + CHECK_EVERY_S
        self._since, self._looked = ticks, now
        if threads != current:
            torch.set_num_threads(threads)
        self._set = threads


_GOVERNOR: ThreadGovernor | None = None


def adapt_threads(device: torch.device) -> int | None:
    """Between forwards of a model on ``device``: run on the cores other processes left (CPU only).
    Returns the CPU threads the next forward runs on (None on a GPU), for :meth:`Stats.note_threads`."""
    global _GOVERNOR
    if device.type != "cpu":
        return None
    if os.environ.get("SPECDEC_ADAPT_THREADS", "1") != "0":
        if _GOVERNOR is None:
            _GOVERNOR = ThreadGovernor()
        _GOVERNOR.adjust()
    return torch.get_num_threads()


def chosen_threads() -> int:
    """The intra-op threads this process chose — the count the governor never exceeds, whatever it runs on now: what
    a run that recorded fewer (``Stats.threads``) lost cores against. The most threads any run recorded is not:
    a neighbour that held a core through every run left them all at one thread, and no report said so."""
    if _GOVERNOR is not None and _GOVERNOR.most is not None:
        return _GOVERNOR.most
    return torch.get_num_threads()
