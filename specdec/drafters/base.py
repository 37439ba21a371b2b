"""The one interface every drafting method implements, and the name registry.

A drafter only *proposes*; it never decides acceptance (that is :mod:`specdec.verify`) and never
drives the loop (that is :mod:`specdec.engine`). The engine tells it what was accepted so it can roll
its own state (a draft KV cache, an n-gram index …) forward or back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import torch

from specdec.errors import SpecdecError


@dataclass
class Draft:
    """Proposed continuation of the committed tokens.

    ``tokens [k]`` are token ids. ``probs [k, vocab]`` is the draft distribution q each token was
    sampled from, after the same sampling transform the target gets; ``None`` means the proposal is
    deterministic (q is a point mass on each token), as for n-gram lookup or greedy drafting.
    ``prefix_accept [k]``, optional: the drafter's estimate that its first j+1 tokens are all
    accepted; the engine then verifies only the length worth its measured cost
    (:meth:`specdec.adaptive.VerifyCosts.best_length`). Such a draft may be longer than the round's
    k, up to the request's γ maximum: k budgets model steps, which it did not take; nor does it
    update the γ controller's α or draft cost.
    """

    tokens: list[int]
    probs: torch.Tensor | None = None
    prefix_accept: list[float] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def clipped(self, max_len: int, vocab_size: int) -> "Draft":
        """At most ``max_len`` tokens, cut before the first id outside the target's vocabulary.

        The engine applies this to every proposal so a misbehaving drafter (or a cache filled under
        another tokenizer) costs acceptance, never a crash or a wrong token.
        """
        keep = 0
        for token in self.tokens[:max_len]:
            if not 0 <= token < vocab_size:
                break
            keep += 1
        if keep == len(self.tokens):
            return self
        return Draft(self.tokens[:keep], None if self.probs is None else self.probs[:keep],
                     None if self.prefix_accept is None else self.prefix_accept[:keep])


@runtime_checkable
class Drafter(Protocol):
    name: str

    def start(self, prompt_ids: list[int]) -> None:
        """A new request begins with these prompt tokens."""

    def propose(self, context_ids: list[int], k: int) -> Draft:
        """Propose up to ``k`` tokens to follow ``context_ids`` (all committed tokens). May return fewer."""

    def accepted(self, num_accepted: int, next_token: int) -> None:
        """The target accepted the first ``num_accepted`` proposed tokens, then committed ``next_token``."""

    def finish(self) -> None:
        """The request is over (free per-request memory; global caches may learn from it)."""

    # Optional: ``bind_target_state(state)`` — called after prefill with the target's cache of the
    # request, for drafters that run inside it (self-speculation, layers.py). The drafter must leave
    # the cache at the length it found it.
    # Optional: ``has_free_tokens = True`` — the engine asks propose() even when the γ controller
    # chose k = 0 (its model does not pay): the drafter may still return a draft with
    # ``prefix_accept`` that costs no model step (draft_suffix's table rounds), or nothing.
    # Optional: ``model_forwards`` — draft-model forwards so far this request (GB/s counts them).


#: name → factory(target, spec_config, sampling_params, generator, **resources) -> Drafter
DRAFTERS: dict[str, Callable[..., Drafter]] = {}


def register_drafter(name: str) -> Callable[[Callable[..., Drafter]], Callable[..., Drafter]]:
    def decorate(factory: Callable[..., Drafter]) -> Callable[..., Drafter]:
        DRAFTERS[name] = factory
        return factory

    return decorate


def get_drafter_factory(name: str) -> Callable[..., Drafter]:
    import specdec.drafters  # noqa: F401 - populates the registry

    if name not in DRAFTERS:
        raise SpecdecError(f"unknown speculative method {name!r}; available: {', '.join(sorted(DRAFTERS))}")
    return DRAFTERS[name]
