"""The one thread that runs the model: loading, per-request setup and every decoding step.

Why one thread, round-robin over the active requests, instead of a thread per request: torch's CPU
kernels run on an OpenMP team that belongs to the *calling* thread. A second thread that runs torch
ops gets a second team, and once libgomp manages more threads than there are cores it stops letting
idle workers spin, so every parallel region waits to wake a sleeping worker. Measured on the 1.5B
int8 target, 48 greedy tokens (2 cores): load and generate on one thread 14.6–16.9 tok/s; load on the
main thread and generate on another 8.3–11.0. The HTTP side (event loop, tokenizer) never touches
torch; everything else is submitted here.

Continuous batching: every active request runs until it needs the target (its prefill, or its
draft to verify: the engine's :class:`~specdec.engine.TargetCall`), then one forward serves all of
them (``Backend.forward_batch``: each request's logits bit-identical to its own forward, so output
under load equals output alone). Requests join and leave between forwards; a cancelled request is
dropped before its next one. Drafting still runs per request, between forwards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Generator, TypeVar

from specdec.engine import TargetCall

T = TypeVar("T")

#: what a stream's consumer receives after the last chunk (or after an exception)
END = object()


@dataclass
class _Stream:
    steps: Generator[Any, Any, None]  # engine.generate_steps: StreamChunks and TargetCalls
    deliver: Callable[[Any], None]  # called on the model thread: must only hand the item over
    cancelled: Callable[[], bool]
    #: the forward this stream waits for, and the logits to send it when it goes on
    call: TargetCall | None = None
    reply: Any = None

    def advance(self) -> bool:
        """Run until the stream needs the target (``self.call`` set): True; False once it is
        finished (delivered END) or dropped."""
        if self.cancelled():
            return self._close()
        try:
            while True:
                item, self.reply = self.steps.send(self.reply), None
                if isinstance(item, TargetCall):
                    self.call = item
                    return True
                self.deliver(item)
        except StopIteration:
            return self._close()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            return self.fail(exc)

    def fail(self, exc: BaseException) -> bool:
        self.deliver(exc)
        return self._close()

    def _close(self) -> bool:
        self.steps.close()  # runs the engine's cleanup (drafter state) even when cancelled
        self.deliver(END)
        return False


class ModelExecutor:
    """Runs submitted calls and steps the registered streams, all on one daemon thread."""

    def __init__(self, name: str = "specdec-model", max_num_batched_tokens: int = 2048) -> None:
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        #: the target's batched forward (``Backend.forward_batch``), set by :meth:`set_target`
        self._forward_batch: Callable[[list], list] | None = None
        self._on_batch: Callable[[int, int], None] | None = None
        #: rows of one batched forward; a call larger than this runs alone
        self.max_num_batched_tokens = max_num_batched_tokens
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def set_target(self, forward_batch: Callable[[list], list],
                   on_batch: Callable[[int, int], None] | None = None) -> None:
        """The batched forward the streams' target calls go through (before the first stream);
        ``on_batch(requests, tokens)`` hears of every forward (the server's metrics)."""
        self._forward_batch, self._on_batch = forward_batch, on_batch

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the model thread and return its result (raises what it raised)."""
        return self._submit(fn).result()

    async def run(self, fn: Callable[[], T]) -> T:
        """``call`` for a coroutine: the event loop keeps serving while ``fn`` runs."""
        return await asyncio.wrap_future(self._submit(fn))

    def add_stream(self, steps: Generator[Any, Any, None], deliver: Callable[[Any], None],
                   cancelled: Callable[[], bool]) -> None:
        """Run ``steps`` (an ``engine.generate_steps`` generator) batched with the other streams; each
        chunk, an exception, then :data:`END` goes to ``deliver``, which runs on the model thread."""
        if self._forward_batch is None:
            raise RuntimeError("ModelExecutor.set_target must be called before streams are added")
        self._inbox.put(_Stream(steps, deliver, cancelled))

    def _submit(self, fn: Callable[[], T]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put((fn, future))
        return future

    def _loop(self) -> None:
        streams: list[_Stream] = []
        while True:
            try:
                item = self._inbox.get(block=not streams)  # idle: sleep until work arrives
            except queue.Empty:
                item = None
            while item is not None:  # everything that arrived: new streams join this forward
                if isinstance(item, _Stream):
                    streams.append(item)
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
            streams = [s for s in streams if s.call is not None or s.advance()]
            if streams:
                self._step(streams)

    def _step(self, streams: list[_Stream]) -> None:
        """One batched target forward for the streams waiting on one, oldest first, up to
        ``max_num_batched_tokens`` rows (the first always runs, however long)."""
        batch, rows = [], 0
        for stream in streams:
            assert stream.call is not None
            size = len(stream.call.tokens)
            if batch and rows + size > self.max_num_batched_tokens:
                break
            batch.append(stream)
            rows += size
        assert self._forward_batch is not None
        try:
            logits = self._forward_batch([(s.call.state, s.call.tokens, s.call.num_logits, s.call.tree) for s in batch])
        except BaseException as exc:  # noqa: BLE001 - every request of the batch gets the error
            for stream in batch:
                stream.call = None
                stream.fail(exc)
                streams.remove(stream)
            return
        if self._on_batch is not None:
            self._on_batch(len(batch), rows)
        for stream, rows_logits in zip(batch, logits):
            stream.call, stream.reply = None, rows_logits
        served = {id(stream) for stream in batch}
        streams[:] = [s for s in streams if id(s) not in served] + batch  # who waited goes first next time
