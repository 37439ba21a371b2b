"""The one thread that runs the model: loading, per-request setup and every decoding step.

Why one thread, round-robin over the active requests, instead of a thread per request: torch's CPU
kernels run on an OpenMP team that belongs to the *calling* thread. A second thread that runs torch
ops gets a second team, and once libgomp manages more threads than there are cores it stops letting
idle workers spin, so every parallel region waits to wake a sleeping worker. Measured on the 1.5B
int8 target, 48 greedy tokens (2 cores): load and generate on one thread 14.6–16.9 tok/s; load on the
main thread and generate on another 8.3–11.0. The HTTP side (event loop, tokenizer) never touches
torch; everything else is submitted here.

Continuous batching: the thread drives a :class:`specdec.scheduler.Batcher` — every active request
runs until it needs a model, then one forward per model serves all of them (the target's
verifications together, the draft model's steps together); requests join and leave between
forwards; a cancelled request is dropped before its next one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from typing import Any, Callable, Generator, TypeVar

from specdec.forward_costs import Forward
from specdec.scheduler import END, Batcher, Stream

T = TypeVar("T")
__all__ = ["END", "ModelExecutor"]


class ModelExecutor:
    """Runs submitted calls and steps the registered streams, all on one daemon thread."""

    def __init__(self, name: str = "specdec-model", max_num_batched_tokens: int = 2048) -> None:
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        #: the streams and their batched forwards, once :meth:`enable_batching` made it
        self._batcher: Batcher | None = None
        #: rows of one batched forward; a call larger than this runs alone
        self.max_num_batched_tokens = max_num_batched_tokens
        #: the most prompt passes one forward carries (Batcher; None: as many as fit)
        self.prompts_per_forward: int | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def enable_batching(self, on_forward: Callable[[Forward], None] | None = None) -> None:
        """Accept streams from now on (before the first); ``on_forward`` hears of every forward (the
        server's metrics and its load policy's measured costs)."""
        self._batcher = Batcher(self.max_num_batched_tokens, on_forward, self.prompts_per_forward)

    def prompt_pending(self) -> bool:
        """Whether a stream still waits for its prompt pass (:meth:`Batcher.prompt_pending`); asked on
        the model thread, by the streams."""
        return self._batcher is not None and self._batcher.prompt_pending()

    def others_in_flight(self) -> bool:
        """Whether the asking stream has company (:meth:`Batcher.others_in_flight`); asked on the model thread."""
        return self._batcher is not None and self._batcher.others_in_flight()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the model thread and return its result (raises what it raised)."""
        return self._submit(fn).result()

    async def run(self, fn: Callable[[], T]) -> T:
        """``call`` for a coroutine: the event loop keeps serving while ``fn`` runs."""
        return await asyncio.wrap_future(self._submit(fn))

    def add_stream(self, steps: Generator[Any, Any, None], deliver: Callable[[Any], None],
                   cancelled: Callable[[], bool]) -> None:
        """Run ``steps`` (an ``engine.generate_steps`` generator) batched with the other streams; each
        chunk, an exception, then :data:`END` goes to ``deliver``, which runs on the model thread.
        Added from a :meth:`run` call (on the model thread, between forwards), the stream joins
        before the next forward."""
        if self._batcher is None:
            raise RuntimeError("ModelExecutor.enable_batching must be called before streams are added")
        self._inbox.put(Stream(steps, deliver, cancelled))

    def _submit(self, fn: Callable[[], T]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put((fn, future))
        return future

    def _loop(self) -> None:
        while True:
            busy = self._batcher is not None and bool(self._batcher.streams)
            try:
                item = self._inbox.get(block=not busy)  # idle: sleep until work arrives
            except queue.Empty:
                item = None
            while item is not None:  # everything that arrived: new streams join this forward
                if isinstance(item, Stream):
                    assert self._batcher is not None
                    self._batcher.add(item)
                else:
                    fn, future = item
                    if future.set_running_or_notify_cancel():
                        try:
                            future.set_result(fn())
                        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
                            future.set_exception(exc)
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = None
            if self._batcher is not None:
                self._batcher.step()
