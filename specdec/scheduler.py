"""Continuous batching: many requests' engine steps, their model calls served by shared forwards.

Each request is an :func:`specdec.engine.generate_steps` generator. It runs until it needs a model —
the target for its prefill or to verify a draft or token tree, or its draft model for a draft step: a
:class:`~specdec.calls.ModelCall` — and then one ``Backend.forward_batch`` per model serves every
request waiting on that model (each result bit-identical to the request's own forward, so output
under load is output alone): the target's verifications in one forward, the draft model's steps in
another. Requests join and leave between forwards. The server's model thread
(:mod:`specdec.server.executor`) and the offline batch API (:func:`specdec.batch.generate_batch`)
both drive a :class:`Batcher`; it runs on the caller's thread, the one whose OpenMP team runs torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Generator

from specdec.calls import ModelCall
from specdec.forward_costs import Forward

#: what a stream's consumer receives after the last chunk (or after an exception)
END = object()
#: draft-model forwards one step serves before the target's (a bound: drafts end by themselves)
MAX_DRAFT_ROUNDS = 64


@dataclass
class Stream:
    """One request in a :class:`Batcher`."""

    steps: Generator[Any, Any, None]  # engine.generate_steps: StreamChunks and ModelCalls
    deliver: Callable[[Any], None]  # gets each chunk, an exception, then END: must only hand the item over
    cancelled: Callable[[], bool]
    #: the forward this stream waits for, and the logits to send it when it goes on
    call: ModelCall | None = None
    reply: Any = None
    #: no token delivered yet: the request's prompt pass (or a chunk of it) is still to run
    prefilling: bool = True
    #: its place in arrival order (Batcher.add): prompt passes are served first come, first served
    arrival: int = 0

    def advance(self) -> bool:
        """Run until the stream needs a model (``self.call`` set): True; False once it is
        finished (delivered END) or dropped."""
        if self.cancelled():
            return self._close()
        try:
            while True:
                item, self.reply = self.steps.send(self.reply), None
                if isinstance(item, ModelCall):
                    self.call = item
                    return True
                self.prefilling = False
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

    def __init__(self, max_num_batched_tokens: int = 2048, on_forward: Callable[[Forward], None] | None = None,
                 prompts_per_forward: int | None = None) -> None:
        """``max_num_batched_tokens``: rows of one forward (a call larger than this runs alone);
        ``on_forward`` hears of each forward, target's and draft models' (the server's metrics, the
        load policy's measured costs: specdec.forward_costs); ``prompts_per_forward``: the most
        prompt passes (or chunks) one forward carries (None: as many as fit). 1 where prompt passes are
        compute-bound (chunked prefill on a CPU): two prompts in one forward cost their sum and both
        first tokens wait for it; one at a time, the first waits only for its own."""
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prompts_per_forward = prompts_per_forward
        self.on_forward = on_forward
        self.streams: list[Stream] = []
        self._arrivals = 0
        self._asking: Stream | None = None  # the stream whose generator runs now (others_in_flight asks about it)

    def add(self, stream: Stream) -> None:
        self._arrivals += 1
        stream.arrival = self._arrivals
        self.streams.append(stream)

    def prompt_pending(self) -> bool:
        """Whether a request still waits for its prompt pass. The server and the offline batch API ask it
        before each round of the running requests: while one does, they draft nothing. Why: a new request's
        first token waits for every draft-model step and verification row of the forwards before and
        with its prompt pass, and a forward that carries a prompt is compute-bound — there a
        verification row costs what a plain decode row costs but commits fewer tokens (τ of γ + 1).
        Measured (2-core Zen 4, 8 requests in flight, speculation forced on): median time to first
        token 0.435 vs 0.788 s; under the server's default policy nothing drafts at 8 requests and the
        difference was within noise. Output is unchanged: how much a round drafts never changes what
        is committed."""
        return any(stream.prefilling for stream in self.streams)

    def others_in_flight(self) -> bool:
        """Whether the asking request (the stream whose generator runs now, inside :meth:`_advance`) has company: a
        prompt chunk asked now shares its forward with their decode steps, delaying each one's next token by the
        chunk's cost. Those decoding count, and those in a prompt that arrived earlier: prompts go first come, first
        served, so theirs runs first and they decode by the time this chunk's forward runs (asking "is one
        decoding?" gave every prompt of a batch its first chunk whole). Those that arrived later do not: they wait
        for this prompt's end, and small chunks would only add forwards."""
        asking = self._asking
        return any(stream is not asking and (asking is None or not stream.prefilling or stream.arrival < asking.arrival)
                   for stream in self.streams)

    def step(self) -> None:
        """Advance every stream to its next model call (finished ones leave); serve the draft models'
        calls and move those streams on until every stream waits on the target (a draft of γ steps is
        γ such rounds, each one forward per draft model for all requests); then serve the target's
        calls, oldest first, in one forward of up to ``max_num_batched_tokens`` rows. Drafting first
        keeps the requests in phase: served in the same step, one request's draft step and another's
        verification went to separate forwards and no verification was ever shared (measured: 2
        concurrent requests speculating at 0.86× plain)."""
        self._advance()
        for _ in range(MAX_DRAFT_ROUNDS):
            drafting = [s for s in self.streams if s.call is not None and s.call.role != "target"]
            if not drafting:
                break
            self._serve_groups(drafting)
            self._advance()
        self._serve_groups([s for s in self.streams if s.call is not None and s.call.role == "target"])
        # who waited goes first next time (the served keep their order at the back)
        waiting = [s for s in self.streams if s.call is not None]
        self.streams = waiting + [s for s in self.streams if s.call is None]

    def _advance(self) -> None:
        """Move every stream not waiting on a forward to its next call; finished ones leave. Streams
        still in their prompt go first: one whose prompt pass just ran delivers its first token before
        the others ask :meth:`prompt_pending`."""
        finished = {id(s) for s in sorted(self.streams, key=lambda s: not s.prefilling) if s.call is None and not self._run(s)}
        self.streams = [s for s in self.streams if id(s) not in finished]

    def _run(self, stream: Stream) -> bool:
        """``stream.advance()``, with ``stream`` as the one asking :meth:`others_in_flight` meanwhile."""
        self._asking = stream
        try:
            return stream.advance()
        finally:
            self._asking = None

    def _serve_groups(self, streams: list[Stream]) -> None:
        """One forward per group of calls to the same model (and vocabulary), oldest first, each of up
        to ``max_num_batched_tokens`` rows (a larger call runs alone; the rest wait for the next step).

        Prompt calls (passes or chunks) go first come, first served: the earliest request's prompt keeps the
        prompt places of every forward until its last chunk. Rotated like the decode calls (whoever was
        served moved to the back), three 2k-token prompts' chunks took turns with one prompt per forward and
        all three first tokens came at the end (55.5, 58.0, 58.4 s), where the first needed a third of that."""
        prompt_places = [index for index, stream in enumerate(streams) if stream.call is not None and stream.call.prompt]
        if len(prompt_places) > 1:
            streams = list(streams)
            by_arrival = sorted((streams[index] for index in prompt_places), key=lambda stream: stream.arrival)
            for index, stream in zip(prompt_places, by_arrival):
                streams[index] = stream
        groups: dict[tuple[int, int | None], tuple[list[Stream], list[int]]] = {}
        for stream in streams:
            assert stream.call is not None
            batch, counts = groups.setdefault(stream.call.group, ([], [0, 0]))  # rows, prompt calls
            size = len(stream.call.tokens)
            if batch and counts[0] + size > self.max_num_batched_tokens:
                continue
            if stream.call.prompt and self.prompts_per_forward is not None and counts[1] >= self.prompts_per_forward:
                continue
            batch.append(stream)
            counts[0] += size
            counts[1] += stream.call.prompt
        for batch, counts in groups.values():
            self._serve(batch, counts[0])

    def _serve(self, batch: list[Stream], rows: int) -> None:
        """One ``forward_batch`` for calls to the same model; each call is charged its rows' share of it."""
        first = batch[0].call
        assert first is not None
        start = time.perf_counter()
        try:
            logits = first.backend.forward_batch([(s.call.state, s.call.tokens, s.call.num_logits, s.call.tree) for s in batch],
                                                 vocab_limit=first.vocab_limit)
        except BaseException as exc:  # noqa: BLE001 - every request of the batch gets the error
            for stream in batch:
                stream.call = None
                stream.fail(exc)
                self.streams.remove(stream)
            return
        seconds = time.perf_counter() - start
        if self.on_forward is not None:
            self.on_forward(Forward(first.backend, first.role, len(batch), rows, sum(s.call.prompt for s in batch), seconds,
                                    prompt_rows=sum(len(s.call.tokens) for s in batch if s.call.prompt),
                                    weight_passes=first.backend.weight_passes(len(batch))))
        for stream, rows_logits in zip(batch, logits):
            stream.call.seconds = seconds * len(stream.call.tokens) / max(1, rows)
            stream.call, stream.reply = None, rows_logits
