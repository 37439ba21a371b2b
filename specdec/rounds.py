"""One speculative round's parts, run in order by :func:`specdec.engine.generate_steps`:

1. :func:`fit_draft` — cut the drafter's proposal to what this round may verify: a tree to its node
   budget and the measured verify cost, a chain to γ (or, where the drafter estimated its own
   acceptance, to the length the cost model picks), and either to what a grammar allows;
2. :func:`verify_round` — one target forward over the last committed token and the draft (a tree
   with its ancestor mask), the verifier's walk, the KV cache cut to the accepted path;
3. :func:`tell_drafter` and :func:`learn` — the drafter hears what was kept, the γ controller (or
   the verify-cost curve) what the round cost and accepted.

Beside them: :func:`check_proposal` (a user's drafter broke the Draft contract: one clear error) and
:func:`proposed_for_alpha` (what the round counts as proposed in α).

Kept apart from the engine so the loop itself reads in one screen (gpt-fast's ``generate.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator

import torch

from specdec.adaptive import GammaController, VerifyCosts
from specdec.alternatives import chain_nodes_in, measured_wins
from specdec.backends.base import Backend, SequenceState
from specdec.calls import ModelCall, one, waited
from specdec.drafters.base import Draft, Drafter
from specdec.errors import DrafterError, SpecdecError
from specdec.penalties import Penalties
from specdec.sampling import SamplingParams
from specdec.stats import Stats
from specdec.structured import GrammarConstraint
from specdec.tree import TreeLayout, children, depths, first_chain, subtree
from specdec.verify import verify, verify_tree


@dataclass
class FittedDraft:
    """A proposal cut to what this round verifies."""

    draft: Draft
    #: tree proposals: ``kept[i]`` is the drafter's node number of node i of the verified tree
    kept: list[int] | None
    #: the drafter's own tokens in ``draft`` (a chain's; grammar-forced tokens come after them)
    drafted: int
    #: tokens the grammar accepts, forced ones included (``drafted`` without a grammar)
    grammatical: int


@dataclass
class Verified:
    """One verified round."""

    #: the accepted draft tokens, then the target's own next token
    new_tokens: list[int]
    #: ``[len(new_tokens), vocab]``: row i scored ``new_tokens[i]`` (for logprobs)
    logits: torch.Tensor
    #: draft tokens accepted, grammar-forced ones included
    accepted: int
    #: of those, the drafter's own
    drafter_accepted: int
    #: what a chain of the drafter's first choices would have accepted (the γ controller's unit)
    chain_accepted: int
    #: the drafter's node numbers of the accepted path when it drafted a tree (None: tell it a count)
    drafter_path: list[int] | None
    #: the round as the acceptance view reads it (the accepted path and the candidate tried after it)
    verified_as: list[int]
    #: trees: (the depth of the first-choice chain, how far the accepted path followed it)
    first_choices: tuple[int, int] | None
    #: seconds spent suspended while other requests' forwards ran (not this round's cost)
    idle: float


def fit_draft(draft: Draft, k: int, room: int, nodes: int, free_slots: int, verify_costs: VerifyCosts,
              vocab_size: int, constraint: GrammarConstraint | None) -> FittedDraft:
    """Cut ``draft`` to this round: ``k`` model tokens (γ), no deeper than ``room``, a tree to at most
    ``nodes`` nodes and the target cache's ``free_slots``. Under a grammar a tree becomes its chain
    (grammar cuts and forced tokens are chain operations), the chain is cut at the first token the
    grammar refuses, and tokens the grammar forces after it are appended (accepted whatever the
    logits: :mod:`specdec.structured`)."""
    kept = None
    if draft.is_tree and (constraint is not None or nodes <= 0):  # (no tree budget: trees are off for the request)
        draft = draft.as_chain()
    if draft.is_tree:
        kept = fit_tree(draft, nodes, room, free_slots, verify_costs, vocab_size)
        draft = draft.nodes(kept)
    elif draft.prefix_accept is not None and len(draft):
        # the drafter estimated its own acceptance: the cost model picks the length, up to the room
        # left rather than this round's γ (see Draft)
        draft = draft.clipped(room, vocab_size)
        draft = draft.clipped(verify_costs.best_length(draft.prefix_accept), vocab_size)
    else:
        draft = draft.clipped(k, vocab_size)
    grammatical = drafted = len(draft)
    if constraint is not None:
        verified, grammatical = constraint.draft_cut(draft.tokens, sampled=draft.probs is not None)
        draft = draft.clipped(verified, vocab_size)
        drafted = len(draft)
        if grammatical == drafted and room > drafted:
            forced = constraint.forced_tokens(draft.tokens, room - drafted)
            draft = draft.extended(forced, vocab_size)
            grammatical += len(forced)
    return FittedDraft(draft, kept, drafted, grammatical)


def fit_tree(draft: Draft, max_nodes: int, room: int, slots: int, verify_costs: VerifyCosts, vocab_size: int) -> list[int]:
    """The nodes of a tree proposal worth verifying (ascending, a tree): no deeper than ``room``
    (tokens the request may still commit), ids in the vocabulary, at most ``max_nodes`` and
    ``slots - 1`` (the target cache's free slots, the last committed token included) — the
    likeliest, as many as the measured verify cost says pay when the drafter estimated its nodes
    (:meth:`VerifyCosts.best_tree`), else the first ones."""
    assert draft.parents is not None
    usable = draft.usable_nodes(vocab_size, max_depth=room)
    limit = max(0, min(max_nodes, slots - 1))
    if draft.prefix_accept is None:
        return usable[:limit]
    chosen = verify_costs.best_tree(subtree(draft.parents, usable), [draft.prefix_accept[n] for n in usable], limit)
    return [usable[i] for i in chosen]


def verify_round(target: Backend, state: SequenceState, context: list[int], fitted: FittedDraft, params: SamplingParams,
                 generator: torch.Generator, constraint: GrammarConstraint | None, penalties: Penalties | None,
                 stats: Stats) -> Generator[ModelCall, torch.Tensor, Verified]:
    """Verify ``fitted`` after ``context`` (whose last token the target cache does not hold yet) in
    one target forward, and cut the cache to the accepted path. Trees are recorded in ``stats``."""
    draft = fitted.draft
    if not draft.is_tree:
        logits, idle = yield from waited(one(ModelCall(target, state, [context[-1], *draft.tokens])))
        scored = constraint.mask_rows(logits, fitted.grammatical) if constraint is not None else logits
        if penalties is not None:  # row i after the output so far and the first i drafted tokens
            scored = penalties.apply(scored, penalties.output_of(context), draft.tokens)
        accepted, next_token = verify(draft.tokens, draft.probs, scored, params, generator, position=len(context))
        state.truncate(len(context) + accepted)
        drafter_accepted = min(accepted, fitted.drafted)  # grammar-forced tokens after it are the engine's
        return Verified([*draft.tokens[:accepted], next_token], logits, accepted, drafter_accepted, drafter_accepted,
                        None, draft.tokens[: fitted.drafted], None, idle)

    assert draft.parents is not None
    logits, idle = yield from waited(one(ModelCall(
        target, state, [context[-1], *draft.tokens], tree=TreeLayout(len(context) - 1, [-1, *(p + 1 for p in draft.parents)]))))
    scored = logits if penalties is None else penalties.apply_tree(logits, penalties.output_of(context), draft.tokens,
                                                                   draft.parents)  # each node after its own path
    path, next_token = verify_tree(draft.tokens, draft.parents, scored, params, generator, draft.node_probs,
                                   position=len(context))
    rows = [0, *(node + 1 for node in path)]  # the last committed token, then the accepted nodes
    state.keep(rows, len(context) - 1)
    new_tokens = [*(draft.tokens[node] for node in path), next_token]
    if draft.node_probs is None:  # the drafter's own tree, cut by fit_tree
        assert fitted.kept is not None
        chain_accepted, drafter_path = len(path), [fitted.kept[node] for node in path]
    else:  # a sampled chain with alternatives (specdec.alternatives): the drafter drafted the chain
        chain_accepted, drafter_path = chain_nodes_in(path, fitted.drafted), None
        won, promised = measured_wins(draft, fitted.drafted, path)
        stats.alternative_wins += won
        stats.alternative_promised += promised
    verified_as, first_choices = tree_round(draft, path, stats)
    return Verified(new_tokens, logits[rows], len(path), len(path), chain_accepted, drafter_path, verified_as,
                    first_choices, idle)


def tree_round(draft: Draft, path: list[int], stats: Stats) -> tuple[list[int], tuple[int, int]]:
    """Record a verified tree in ``stats``; return the round as the acceptance view and the α-per-
    position counts read it — the accepted path, then the first candidate tried where it stopped —
    and as a chain of the drafter's first choices would have seen it (Round.first_choices: that
    chain's depth, and how far the path followed it)."""
    assert draft.parents is not None
    stats.record_tree(len(draft), path, draft.parents)
    chain = first_chain(draft.parents)
    followed = next((i for i, (node, first) in enumerate(zip(path, chain)) if node != first), min(len(path), len(chain)))
    tried = children(draft.parents).get(path[-1] if path else -1, [])[:1]  # the verifier tries children in order
    return [draft.tokens[n] for n in path + tried], (len(chain), followed)


def tell_drafter(drafter: Drafter, fitted: FittedDraft, verified: Verified) -> None:
    """The accept step of the drafter's lifecycle: the path it drafted that was kept, or how many of
    its chain's tokens were (and the token the target put after them)."""
    if verified.drafter_path is not None:
        drafter.accepted_path(verified.drafter_path, verified.new_tokens[-1])
    elif fitted.drafted:
        drafter.accepted(verified.chain_accepted, verified.new_tokens[verified.chain_accepted])


def learn(gamma: GammaController | None, verify_costs: VerifyCosts, drafter: Drafter | None, fitted: FittedDraft,
          verified: Verified, draft_s: float | None, verify_s: float | None) -> None:
    """Feed the round to the γ controller — a model-drafted tree as its depth and first-choice chain,
    a model-drafted chain as drafted/accepted, a free draft (its tokens cost no model step) as a
    verification only — or, without one, to the verify-cost curve. ``None`` seconds: not timed."""
    draft = fitted.draft
    if gamma is None:
        verify_costs.update(len(draft), verify_s)
    elif draft.is_tree and drafter is not None and drafter.model_forwards is not None:
        gamma.update_tree(max(depths(draft.parents), default=0), verified.chain_accepted, len(draft), draft_s, verify_s)
    elif draft.prefix_accept is None:
        gamma.update(fitted.drafted, verified.drafter_accepted, draft_s, verify_s)
    else:
        gamma.update_free_round(fitted.drafted, verify_s)


def proposal(drafter: Drafter, context: list[int], k: int) -> Generator[ModelCall, torch.Tensor, tuple[Draft, float]]:
    """The drafter's proposal for this round and the seconds it waited on other requests' work
    (:func:`specdec.calls.waited`). A drafter from outside specdec (a plugin, a user's class) proposes on a copy of
    the committed tokens — one that wrote into the list it was given (``context_ids[-1] = …``) changed the engine's
    own record of the output, and the text with it — and its failures other than specdec's own errors are one
    :class:`DrafterError` naming it (the cause chained): its RuntimeError came out of generate/serve as a bare
    exception of no named method. The built-in drafters read the list as is (a copy per round and request costs
    ~60 µs at 32k tokens) and their errors keep their own type and traceback."""
    if type(drafter).__module__.startswith("specdec."):
        return (yield from waited(drafter.propose_steps(context, k)))
    try:
        return (yield from waited(drafter.propose_steps(list(context), k)))
    except SpecdecError:
        raise
    except Exception as exc:
        raise DrafterError(f"drafter {drafter.name!r}: propose() failed: {type(exc).__name__}: {exc}") from exc


def check_proposal(drafter: Drafter, draft: object, vocab_size: int) -> None:
    """A drafter's proposal is a :class:`Draft` of int token ids whose q rows span the vocabulary: a user's drafter
    returning a list, tokens as a tensor or strings, or q of another width, failed deep in the verifier or the batch
    policy (AttributeError, IndexError, "Boolean value of Tensor … is ambiguous") — now one DrafterError naming it.
    (Token ids outside the vocabulary are no error: ``Draft.clipped`` cuts them.)"""
    if not isinstance(draft, Draft):
        raise DrafterError(f"drafter {drafter.name!r}: propose() returned a {type(draft).__name__}, not a specdec.Draft")
    tokens = draft.tokens
    if not isinstance(tokens, list) or any(type(token) is not int for token in tokens):
        held = type(tokens).__name__ if not isinstance(tokens, list) else \
            "a list holding " + next(type(token).__name__ for token in tokens if type(token) is not int)
        raise DrafterError(f"drafter {drafter.name!r}: Draft.tokens must be a list of int token ids, got {held} "
                           "(a tensor's or an array's .tolist() is one)")
    if draft.probs is None:
        return
    shape = tuple(draft.probs.shape)
    width = shape[-1] if shape else 0
    if len(shape) != 2 or shape[0] != len(draft.tokens) or any(width <= t < vocab_size for t in draft.tokens):
        rows = f"{len(draft.tokens)} token{'s' if len(draft.tokens) != 1 else ''}"
        raise DrafterError(f"drafter {drafter.name!r}: Draft.probs is {shape}; it must be [{rows}, the vocabulary] "
                           "with a column for every proposed token id")


def proposed_for_alpha(drafted: int, verified: Verified, consumed: int) -> int:
    """The round's proposed tokens as α counts them: a tree as the chain of its first choices (every node counted,
    a perfect drafter read α 0.5 beside its chain's 1.0; the tree's size is Stats.tree_nodes), and nothing
    drafted past the token that ended the request (a stop string lowered α by drafts the target had accepted)."""
    proposed = drafted if verified.first_choices is None else max(verified.first_choices[0], verified.drafter_accepted)
    return min(proposed, consumed) if consumed < len(verified.new_tokens) else proposed
