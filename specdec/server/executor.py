"""The one thread that runs the model: loading, per-request setup and every decoding step.

Why one thread, round-robin over the active requests, instead of a thread per request: torch's CPU
kernels run on an OpenMP team that belongs to the *calling* thread. A second thread that runs torch
ops gets a second team, and once libgomp manages more threads than there are cores it stops letting
idle workers spin, so every parallel region waits to wake a sleeping worker. Measured on the 1.5B
int8 target, 48 greedy tokens (2 cores): load and generate on one thread 14.6–16.9 tok/s; load on the
main thread and generate on another 8.3–11.0. The HTTP side (event loop, tokenizer) never touches
torch; everything else is submitted here.

Requests advance one step (prefill, or draft + verify) at a time in turn, so a long generation
cannot hold the others back, and a cancelled request is dropped before its next step.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")

#: what a stream's consumer receives after the last chunk (or after an exception)
END = object()


@dataclass
class _Stream:
    chunks: Iterator[Any]
    deliver: Callable[[Any], None]  # called on the model thread: must only hand the item over
    cancelled: Callable[[], bool]

    def step(self) -> bool:
        """Advance one step; False once the stream is finished (delivered END) or dropped."""
        if self.cancelled():
            return self._close()
        try:
            chunk = next(self.chunks)
        except StopIteration:
            return self._close()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            self.deliver(exc)
            return self._close()
        self.deliver(chunk)
        return True

    def _close(self) -> bool:
        close = getattr(self.chunks, "close", None)
        if close is not None:
            close()  # runs the engine's cleanup (drafter state) even when cancelled
        self.deliver(END)
        return False


class ModelExecutor:
    """Runs submitted calls and steps the registered streams, all on one daemon thread."""

    def __init__(self, name: str = "specdec-model") -> None:
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the model thread and return its result (raises what it raised)."""
        return self._submit(fn).result()

    async def run(self, fn: Callable[[], T]) -> T:
        """``call`` for a coroutine: the event loop keeps serving while ``fn`` runs."""
        return await asyncio.wrap_future(self._submit(fn))

    def add_stream(self, chunks: Iterator[Any], deliver: Callable[[Any], None], cancelled: Callable[[], bool]) -> None:
        """Step ``chunks`` in turn with the other streams; each item (a chunk, an exception, then
        :data:`END`) goes to ``deliver``, which runs on the model thread."""
        self._inbox.put(_Stream(chunks, deliver, cancelled))

    def _submit(self, fn: Callable[[], T]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put((fn, future))
        return future

    def _loop(self) -> None:
        streams: collections.deque[_Stream] = collections.deque()
        while True:
            try:
                item = self._inbox.get(block=not streams)  # idle: sleep until work arrives
            except queue.Empty:
                item = None
            if isinstance(item, _Stream):
                streams.append(item)
            elif item is not None:
                fn, future = item
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
                        future.set_exception(exc)
            if streams:
                stream = streams.popleft()
                if stream.step():
                    streams.append(stream)
