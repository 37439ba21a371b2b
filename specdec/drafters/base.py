"""The one interface every drafting method implements: the proposal, the drafter base class, the
resources a factory gets and the metadata a method registers with (:mod:`specdec.drafters.registry`).

A drafter only *proposes*; it never decides acceptance (that is :mod:`specdec.verify`) and never
drives the loop (that is :mod:`specdec.engine`). The engine tells it what was accepted so it can roll
its own state (a draft KV cache, an n-gram index …) forward or back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Generator

import torch

from specdec.tree import check_parents, depths, first_chain, subtree

if TYPE_CHECKING:  # annotations only: drafters/base.py sits below every module it names here
    from specdec.backends.base import Backend, SequenceState
    from specdec.calls import ModelCall
    from specdec.config import SpecConfig
    from specdec.sampling import SamplingParams
    from specdec.structured import GrammarConstraint
    from specdec.tokenizer import Tokenizer


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

    ``parents [k]``, optional: the proposal is a token *tree* (:mod:`specdec.tree`): token i follows
    node ``parents[i]`` (-1: the committed tokens), parents before children, siblings distinct.
    Tree tokens are point-mass proposals (``probs`` None; :func:`specdec.verify.verify_tree`) unless
    ``node_probs[i]`` holds the q ``[vocab]`` node i's token was sampled from (a sampled chain with
    alternatives, :mod:`specdec.alternatives`), and ``prefix_accept[i]`` is then the estimate that
    node i's whole path is accepted.
    """

    tokens: list[int]
    probs: torch.Tensor | None = None
    prefix_accept: list[float] | None = None
    parents: list[int] | None = None
    node_probs: list[torch.Tensor | None] | None = None

    def __post_init__(self) -> None:
        if self.parents is not None:
            check_parents(self.parents, len(self.tokens))
            if self.probs is not None:
                raise ValueError("tree drafts carry their sampled nodes' q in node_probs: probs must be None")
        if self.node_probs is not None and (self.parents is None or len(self.node_probs) != len(self.tokens)):
            raise ValueError("node_probs: one entry (q or None) per node of a tree")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    def nodes(self, keep: list[int]) -> "Draft":
        """The tree of nodes ``keep`` (ascending, closed under parents), renumbered; a chain stays a
        chain when ``keep`` is a prefix."""
        if self.parents is None:
            assert keep == list(range(len(keep))), "a chain keeps a prefix"
            return Draft(self.tokens[: len(keep)], None if self.probs is None else self.probs[: len(keep)],
                         None if self.prefix_accept is None else self.prefix_accept[: len(keep)])
        return Draft([self.tokens[i] for i in keep], None,
                     None if self.prefix_accept is None else [self.prefix_accept[i] for i in keep],
                     subtree(self.parents, keep), None if self.node_probs is None else [self.node_probs[i] for i in keep])

    def usable_nodes(self, vocab_size: int, max_len: int | None = None, max_depth: int | None = None) -> list[int]:
        """A tree's nodes (ascending, a tree) among its first ``max_len``, no deeper than
        ``max_depth``, with ids in the vocabulary — and whose parents are kept too."""
        assert self.parents is not None
        level = depths(self.parents)
        kept: set[int] = set()
        for node, (token, parent) in enumerate(zip(self.tokens[:max_len], self.parents)):
            if (0 <= token < vocab_size and (max_depth is None or level[node] <= max_depth)
                    and (parent < 0 or parent in kept)):
                kept.add(node)
        return sorted(kept)

    def as_chain(self) -> "Draft":
        """A tree's first-child path as a chain (what a request with a grammar verifies); a chain as is.
        Its tokens become point masses (exact whatever chose them: a grammar's cut may depend on a
        sampled token, which rejection sampling against its q would not allow)."""
        if self.parents is None:
            return self
        chain = self.nodes(first_chain(self.parents))
        return Draft(chain.tokens, None, chain.prefix_accept)

    def extended(self, tokens: list[int], vocab_size: int) -> "Draft":
        """This draft followed by ``tokens`` proposed with certainty (q a point mass on each)."""
        if not tokens:
            return self
        probs = self.probs
        if probs is not None:
            certain = torch.nn.functional.one_hot(torch.tensor(tokens, device=probs.device), vocab_size).to(probs.dtype)
            probs = torch.cat([probs, certain])
        accept = None if self.prefix_accept is None else self.prefix_accept + [self.prefix_accept[-1] if self.prefix_accept else 1.0] * len(tokens)
        return Draft(self.tokens + tokens, probs, accept)

    def clipped(self, max_len: int, vocab_size: int) -> "Draft":
        """At most ``max_len`` tokens, cut before the first id outside the target's vocabulary.

        The engine applies this to every proposal so a misbehaving drafter (or a cache filled under
        another tokenizer) costs acceptance, never a crash or a wrong token. A tree keeps its first
        ``max_len`` nodes, less those outside the vocabulary and their descendants.
        """
        if self.parents is not None:
            kept = self.usable_nodes(vocab_size, max_len)
            return self if len(kept) == len(self.tokens) else self.nodes(kept)
        keep = 0
        for token in self.tokens[:max_len]:
            if not 0 <= token < vocab_size:
                break
            keep += 1
        if keep == len(self.tokens):
            return self
        return Draft(self.tokens[:keep], None if self.probs is None else self.probs[:keep],
                     None if self.prefix_accept is None else self.prefix_accept[:keep])


@dataclass(frozen=True)
class DrafterResources:
    """Everything a drafter factory may use to build one request's drafter.

    The engine side (:func:`specdec.api.make_drafter`) fills it once; each factory reads the fields
    its method needs. ``draft_backend`` is set only for methods whose :class:`MethodInfo` says
    ``needs_draft_model`` (and then never None).
    """

    target_backend: "Backend"
    spec: "SpecConfig"
    params: "SamplingParams"
    generator: torch.Generator
    max_seq_len: int  # prompt + max_tokens + γ max + 1: the longest sequence a draft cache must hold
    tokenizer: "Tokenizer | None" = None  # the target's; None in tokenizer-free tests
    target_path: Path | None = None  # the target's weights file (per-model calibration files key on it)
    draft_backend: "Backend | None" = None
    #: structured output: the request's grammar state, shared with the engine; model drafters mask
    #: their distribution with it (see :mod:`specdec.structured`)
    constraint: "GrammarConstraint | None" = None
    #: the request's predicted output as token ids (``SamplingParams.prediction``, tokenized; empty
    #: without one); drafters that draft from text read it (:mod:`specdec.prediction`)
    prediction_ids: tuple[int, ...] = ()
    #: the tokens that end the request (:func:`specdec.output.request_stop_ids`): a model drafter bans
    #: them from its q while ``min_tokens`` bans them from the target's p, as plain decoding does
    stop_ids: frozenset[int] = frozenset()


class Drafter:
    """One request's proposer. Subclasses implement :meth:`propose`; every other method has an
    explicit default here, so the engine calls each of them unconditionally (no optional hooks).

    Lifecycle (as llama.cpp's ``common/speculative.h``): :meth:`bind_target_state` (before the
    target's prefill) → :meth:`start` → repeated :meth:`propose` / :meth:`accepted` → :meth:`finish`.
    The engine asks for proposals through :meth:`propose_steps`, the same proposal as a generator
    that yields the model forwards it needs (:class:`specdec.calls.ModelCall`), so a scheduler can
    run many requests' draft steps in one forward; a drafter that runs a model of its own overrides
    it and makes :meth:`propose` drive it (:func:`specdec.calls.run_now`).
    """

    name: str = "drafter"
    #: True when :meth:`propose` may return tokens that cost no model step (a suffix table): the
    #: engine then asks even when the γ controller chose k = 0 for the drafter's model (it does
    #: not pay), and the drafter returns either a draft with ``prefix_accept`` or nothing.
    has_free_tokens: bool = False
    #: draft-model forwards so far this request (GB/s counts their bytes); None: no model runs
    model_forwards: int | None = None

    @property
    def weight_bytes(self) -> int:
        """Bytes of draft weights read per draft-model forward (0 for table-based drafters)."""
        return 0

    @property
    def prediction_counts(self) -> tuple[int, int] | None:
        """``(accepted, rejected)``: tokens drafted from the request's predicted output that the target
        kept, and that it checked and did not keep (OpenAI's ``accepted_prediction_tokens`` /
        ``rejected_prediction_tokens``); None when this drafter does not read a prediction."""
        return None

    @property
    def step_seconds(self) -> float | None:
        """Seconds of one draft token as measured on this machine before the request (the γ cost
        model's prior), or None when unknown (then the controller measures it in the first rounds)."""
        return None

    def catch_up_seconds(self, context_len: int) -> float:
        """Seconds the first proposal costs beyond a normal round, measured-cost estimate: a draft
        model reads the whole context then (its prompt pass). 0: none, or unknown. The engine lets
        a request speculate only if its remaining tokens can pay this back."""
        return 0.0

    def bind_target_state(self, state: "SequenceState") -> None:
        """Called with the target's cache of this request, before its prefill. Drafters that run
        inside it (self-speculation) keep it and must leave it at the length they found it; one
        that drafts from the target's features (EAGLE) asks it to record them; others ignore it."""

    def start(self, prompt_ids: list[int]) -> None:
        """A new request begins with these prompt tokens."""

    def propose(self, context_ids: list[int], k: int) -> Draft:
        """Propose up to ``k`` tokens to follow ``context_ids`` (all committed tokens: a copy, the request's source
        of truth each round). May return fewer."""
        raise NotImplementedError

    def propose_steps(self, context_ids: list[int], k: int) -> "Generator[ModelCall, torch.Tensor, Draft]":
        """:meth:`propose`, yielding each forward of the drafter's own model to whoever drives it and
        receiving its logits. The default (tables, self-speculation in the target's cache) proposes
        at once and yields nothing."""
        return self.propose(context_ids, k)
        yield  # a generator that yields nothing  # noqa: unreachable

    def accepted(self, num_accepted: int, next_token: int) -> None:
        """The target accepted the first ``num_accepted`` proposed tokens, then committed ``next_token``. Called
        only after a round in which tokens this drafter proposed were verified (a round it proposed nothing in, or
        whose proposal was all cut, commits a token too: the next ``propose`` sees it in ``context_ids``)."""

    def accepted_path(self, path: list[int], next_token: int) -> None:
        """After a tree proposal: the target accepted nodes ``path`` (root to leaf), then committed
        ``next_token``. The default serves drafters whose trees are chains (``path`` is then a
        prefix); drafters that branch override it."""
        self.accepted(len(path), next_token)

    def finish(self) -> None:
        """The request is over (free per-request memory; global caches may learn from it)."""


DrafterFactory = Callable[[DrafterResources], Drafter]


def tree_nodes_for(res: DrafterResources, reads_prediction: bool = False) -> int:
    """How many nodes a drafter that can branch may put in a tree (0: propose chains): the
    configuration's budget (``reads_prediction``: for a drafter that drafts from the request's
    predicted output, when it has one), except under a grammar (structured output cuts and extends
    drafts as chains, so the engine would verify only a tree's first path)."""
    if res.constraint is not None:
        return 0
    return res.spec.tree_nodes(res.params.is_greedy, res.target_backend.step_seconds, reads_prediction and bool(res.prediction_ids))


def model_tree_nodes_for(res: DrafterResources) -> int:
    """:func:`tree_nodes_for` a drafter that grows trees from a model's distributions (draft model,
    EAGLE, Medusa): 0 under sampling, where it drafts a sampled chain instead and the engine hangs
    point-mass alternatives on it (:mod:`specdec.alternatives`) — its own trees of point masses
    were accepted less often than the chain they replaced."""
    return tree_nodes_for(res) if res.params.is_greedy else 0


@dataclass(frozen=True)
class MethodInfo:
    """What the CLI, the benchmark runner and the server need to know about a method, in one place.

    ``options`` names the :class:`specdec.config.SpecConfig` fields the method reads (so a front end
    can say when a flag has no effect); ``aliases`` are extra names users may type (``-`` and ``_``
    are interchangeable everywhere).
    """

    name: str
    factory: DrafterFactory
    summary: str
    aliases: tuple[str, ...] = ()
    needs_draft_model: bool = False
    needs_torch_backend: bool = False
    options: tuple[str, ...] = ("num_speculative_tokens",)
    #: drafts from the request's predicted output (``SamplingParams.prediction``) too
    reads_prediction: bool = False
    #: the ``options`` that must be set (a path: the datastore, the trained head) — front ends refuse a
    #: method without them before loading any model (the 1.5B target loaded first, then the error)
    requires: tuple[str, ...] = ()
