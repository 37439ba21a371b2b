"""The server's periodic throughput line, vLLM's "Avg prompt throughput … generation throughput …": every few
seconds while it works, what it generated and computed of prompts, the weights it read, how many requests run
and wait, and how much of what the drafter proposed the target accepted.

Why: the request log says how each request ended and /metrics needs a scraper; an operator watching a terminal
saw nothing while a server worked for minutes (a walkthrough's long prompts). The window counts tokens as they
are computed (prompt rows per forward, generated tokens per chunk), not when requests end, so a minute-long request
shows in every line of its minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, AsyncContextManager, AsyncIterator, Callable

if TYPE_CHECKING:
    from specdec.forward_costs import Forward
    from specdec.stats import Round

log = logging.getLogger("specdec.server.stats")

#: seconds between lines (serve's --log-stats-interval; vLLM logs every 10 s)
DEFAULT_INTERVAL_S = 10.0


@dataclass
class ThroughputWindow:
    """What happened since the last line. Thread-safe: chunks are counted on the event loop, forwards on the
    model thread."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    #: weight bytes the window's forwards read (target and draft): beside tokens/s, the speed against memory's limit
    weight_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_chunk(self, generated_tokens: int, rounds: list[Round]) -> None:
        """One chunk of a request: its new tokens and the decode rounds it completed."""
        with self._lock:
            self.generated_tokens += generated_tokens
            self.drafted += sum(len(one.drafted) for one in rounds)
            self.accepted += sum(one.accepted for one in rounds)

    def add_forward(self, forward: Forward) -> None:
        """One batched forward (on the model thread): the target's prompt rows as it computes them (a long prompt's
        chunks show in every window of its pass; a prefix cache's hits are not computed, so not counted), and
        the weights read, the target's and the draft model's, as often as the backend read them."""
        weight_bytes = forward.backend.weight_bytes * forward.weight_passes  # type: ignore[attr-defined]  # a Backend
        with self._lock:
            self.weight_bytes += weight_bytes
            if forward.role == "target":
                self.prompt_tokens += forward.prompt_rows

    def take(self) -> ThroughputWindow:
        """This window's counts, and a fresh window from now."""
        with self._lock:
            counts = ThroughputWindow(**{name: getattr(self, name) for name in COUNTS})
            for name in COUNTS:
                setattr(self, name, 0)
        return counts


#: the window's counters (every field but its lock)
COUNTS = tuple(one.name for one in fields(ThroughputWindow) if not one.name.startswith("_"))


def stats_line(window: ThroughputWindow, seconds: float, running: int, waiting: int) -> str | None:
    """The line for a window of ``seconds`` (None: nothing happened and nothing is running or waiting)."""
    if not (window.generated_tokens or window.prompt_tokens or running or waiting):
        return None
    line = (f"throughput: generation {window.generated_tokens / seconds:.1f} tok/s, prompt "
            f"{window.prompt_tokens / seconds:.1f} tok/s, weights read {window.weight_bytes / seconds / 1e9:.2f} GB/s; "
            f"running {running}, waiting {waiting}")
    if window.drafted:
        line += (f"; draft acceptance {100 * window.accepted / window.drafted:.1f} % "
                 f"({window.accepted} of {window.drafted} drafted tokens)")
    return line


async def log_stats_forever(window: ThroughputWindow, interval_s: float, load: Callable[[], tuple[int, int]]) -> None:
    """Every ``interval_s``: the window's line, if any (``load()``: running and waiting sequences now).
    Runs until cancelled (the app's shutdown)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        await asyncio.sleep(interval_s)
        now = loop.time()
        line = stats_line(window.take(), now - started, *load())
        started = now
        if line is not None:
            log.info(line)


def stats_lifespan(window: ThroughputWindow, interval_s: float,
                   load: Callable[[], tuple[int, int]]) -> Callable[[Any], AsyncContextManager[None]]:
    """A FastAPI lifespan that logs the window's line every ``interval_s`` while the app serves (0: never); the
    task is stopped and awaited at shutdown, so an error in it is not lost."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:  # noqa: ANN401 - the FastAPI app
        if not interval_s:
            yield
            return
        task = asyncio.create_task(log_stats_forever(window, interval_s, load))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return lifespan
