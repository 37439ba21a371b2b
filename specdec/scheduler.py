"""Continuous batching: many requests' engine steps, their target calls served by shared forwards.

Each request is an :func:`specdec.engine.generate_steps` generator. It runs (drafting included) until
it needs the target — its prefill, or a draft or token tree to verify: a
:class:`~specdec.engine.TargetCall` — and then one ``Backend.forward_batch`` serves every request
waiting on one (each result bit-identical to the request's own forward, so output under load is
output alone). Requests join and leave between forwards. The server's model thread
(:mod:`specdec.server.executor`) and the offline batch API (:func:`specdec.api.generate_batch`)
both drive a :class:`Batcher`; it runs on the caller's thread, the one whose OpenMP team runs torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generator

from specdec.engine import TargetCall

#: what a stream's consumer receives after the last chunk (or after an exception)
END = object()


@dataclass
class Stream:
    """One request in a :class:`Batcher`."""

    steps: Generator[Any, Any, None]  # engine.generate_steps: StreamChunks and TargetCalls
    deliver: Callable[[Any], None]  # gets each chunk, an exception, then END: must only hand the item over
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


class Batcher:
    """The active streams and the batched forwards that move them on."""

    def __init__(self, forward_batch: Callable[[list], list], max_num_batched_tokens: int = 2048,
                 on_batch: Callable[[int, int], None] | None = None) -> None:
        """``forward_batch``: ``Backend.forward_batch``; ``max_num_batched_tokens``: rows of one
        forward (a call larger than this runs alone); ``on_batch(requests, rows)`` hears of each."""
        self.forward_batch = forward_batch
        self.max_num_batched_tokens = max_num_batched_tokens
        self.on_batch = on_batch
        self.streams: list[Stream] = []

    def add(self, stream: Stream) -> None:
        self.streams.append(stream)

    def step(self) -> None:
        """Advance every stream to its next target call (finished ones leave), then serve the
        waiting calls, oldest first, in one forward of up to ``max_num_batched_tokens`` rows."""
        self.streams = [s for s in self.streams if s.call is not None or s.advance()]
        if not self.streams:
            return
        batch, rows = [], 0
        for stream in self.streams:
            assert stream.call is not None
            size = len(stream.call.tokens)
            if batch and rows + size > self.max_num_batched_tokens:
                break
            batch.append(stream)
            rows += size
        try:
            logits = self.forward_batch([(s.call.state, s.call.tokens, s.call.num_logits, s.call.tree) for s in batch])
        except BaseException as exc:  # noqa: BLE001 - every request of the batch gets the error
            for stream in batch:
                stream.call = None
                stream.fail(exc)
                self.streams.remove(stream)
            return
        if self.on_batch is not None:
            self.on_batch(len(batch), rows)
        for stream, rows_logits in zip(batch, logits):
            stream.call, stream.reply = None, rows_logits
        served = {id(stream) for stream in batch}
        self.streams = [s for s in self.streams if id(s) not in served] + batch  # who waited goes first next time
