"""Model forwards as values: what a request's step generator yields when it needs a model.

A request's decoding (:func:`specdec.engine.generate_steps`) and a model drafter's proposal
(:meth:`specdec.drafters.base.Drafter.propose_steps`) are generators that yield a :class:`ModelCall`
whenever they need a forward and are sent its logits back. Whoever drives them decides how calls
run: one at a time, at once (:func:`run_now`, :meth:`ModelCall.run`), or many requests' calls to
the same model in one batched forward (:class:`specdec.scheduler.Batcher`) — the target's
verifications together, the draft model's steps together. Every backend's ``forward_batch`` is
bit-identical per call to its own ``forward``, so how calls are grouped never changes an output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Generator, Literal, TypeVar

import torch

from specdec.backends.base import Backend, SequenceState
from specdec.tree import TreeLayout

T = TypeVar("T")


@dataclass
class ModelCall:
    """``tokens`` appended to ``state`` in ``backend``; logits ``[len(tokens) or num_logits, vocab
    or vocab_limit]`` for the last ``num_logits`` rows (None: all)."""

    backend: Backend
    state: SequenceState  # this request's, in ``backend``
    tokens: list[int]
    num_logits: int | None = None
    tree: TreeLayout | None = None  # a token tree: positions by depth, ancestor mask (specdec.tree)
    vocab_limit: int | None = None  # score only ids < vocab_limit (a drafter's reduced vocabulary)
    role: Literal["target", "draft"] = "target"
    #: part of the target's pass over a new request's prompt (its first token waits on it)
    prompt: bool = False
    #: seconds of forward this call was charged, set by whoever ran it (its share of a batched one)
    seconds: float = 0.0

    def run(self) -> torch.Tensor:
        """This call alone, now."""
        start = time.perf_counter()
        logits = self.backend.forward(self.state, self.tokens, num_logits=self.num_logits, tree=self.tree,
                                      vocab_limit=self.vocab_limit)
        self.seconds = time.perf_counter() - start
        return logits

    @property
    def group(self) -> tuple[int, int | None]:
        """Calls with the same group can share one ``forward_batch``."""
        return id(self.backend), self.vocab_limit


def run_now(steps: Generator[ModelCall, torch.Tensor, T]) -> T:
    """Drive ``steps`` running each call at once; return what it returns."""
    try:
        call = next(steps)
        while True:
            call = steps.send(call.run())
    except StopIteration as stop:
        return stop.value


def waited(steps: Generator[ModelCall, torch.Tensor, T]) -> Generator[ModelCall, torch.Tensor, tuple[T, float]]:
    """``yield from`` ``steps``, and also return the seconds it spent suspended beyond the forward time
    its calls were charged: under batching, other requests' work. Subtracted from a round's
    measured draft and verify times, it leaves what this request's round cost — what the γ
    controller weighs (0 when each call runs at once)."""
    idle = 0.0
    try:
        call = next(steps)
        while True:
            start = time.perf_counter()
            logits = yield call
            idle += max(0.0, time.perf_counter() - start - call.seconds)
            call = steps.send(logits)
    except StopIteration as stop:
        return stop.value, idle


def one(call: ModelCall) -> Generator[ModelCall, torch.Tensor, torch.Tensor]:
    """A single call as steps (for :func:`waited`)."""
    return (yield call)
