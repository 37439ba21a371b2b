"""The drafting loop every model drafter shares — the draft model, EAGLE, Medusa and layer skip: a
chain of single steps (greedy argmax or sampled with q, an early stop where the draft is unsure, a
suffix table's take-over, grammar masks and penalties as the target's rows get them) and EAGLE-2's
dynamic tree for drafters that can score several nodes in one pass. Kept apart from any one drafter
so each of them is its model's bookkeeping only.
"""

from __future__ import annotations

from typing import Callable, Generator

import torch

from specdec.backends.base import Backend
from specdec.calls import ModelCall
from specdec.drafters.base import Draft
from specdec.drafters.vocab import DraftVocab, full_vocab
from specdec.sampling import SamplingParams, greedy_ids, logits_to_probs, sample_from_probs, top_candidates
from specdec.seeded import seeded_choice
from specdec.structured import GrammarConstraint

#: a draft-model tree: children per branching node (its top choices) …
DRAFT_TREE_BRANCHES = 3
#: … the most nodes forwarded per level to branch again (each level costs one draft forward of
#: that many rows: :func:`tree_width` picks how many from the draft's measured step costs) …
DRAFT_TREE_WIDTH = 4
#: … a level of w rows is worth forwarding while it costs at most this many single-row steps …
DRAFT_TREE_WIDTH_COST = 1.2
#: … and the least path value (product of draft probabilities) a node needs beyond its parent's best child
DRAFT_TREE_MIN_VALUE = 0.05


def tree_width(step_seconds: dict[int, float] | None) -> int:
    """Nodes a draft-model tree forwards per level: the most (up to DRAFT_TREE_WIDTH) whose forward
    costs at most DRAFT_TREE_WIDTH_COST single-row steps on this machine — one where extra rows are
    dear (int4 on an AVX2 CPU: 2 rows 1.15×, 4 rows 1.6×), more where they are nearly free (int8:
    4 rows 0.95×; a GPU). Unmeasured: 2. In-process A/B on this box (6 prompts per group, γ=4, 8
    nodes): width 1 or 2 ≥ chains on HumanEval and MT-Bench, neither consistently ahead."""
    if not step_seconds or 1 not in step_seconds:
        return 2
    single = step_seconds[1]
    return max([1] + [w for w in range(2, DRAFT_TREE_WIDTH + 1)
                      if w in step_seconds and step_seconds[w] <= DRAFT_TREE_WIDTH_COST * single])


def ranking_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The draft's distribution a tree ranks its candidates by: the request's sampling transform
    (a candidate's chance of acceptance is the target's transformed probability of it), or the
    plain softmax under greedy."""
    if params.is_greedy:
        return torch.softmax(logits.float(), -1)
    return logits_to_probs(logits, params)


#: grow_tree's ``forward(expand, tokens, parents)``: the ranking distributions of the nodes ``expand``
#: (forwarded together, each after its ancestors), or None when there is no room to forward them
TreeForward = Callable[[list[int], list[int], list[int]], Generator[ModelCall, torch.Tensor, "list[torch.Tensor] | None"]]


def grow_tree(first_probs: torch.Tensor, depth: int, width: int, forward: TreeForward,
              vocab: DraftVocab | None = None) -> Generator[ModelCall, torch.Tensor, Draft]:
    """EAGLE-2's dynamic tree (Li et al. 2024), for any drafter that can score several nodes in one
    pass: ``first_probs [vocab]`` is the distribution after the committed tokens (over the rows of
    ``vocab`` where given: its row indices are mapped to token ids); each node's
    DRAFT_TREE_BRANCHES likeliest tokens become its children, valued by the product of
    probabilities along their path; the ``width`` most valuable new nodes of a level are forwarded
    together to branch at the next, up to ``depth`` levels. Leaves cost no draft work, so the tree
    holds more nodes than a round verifies: the engine keeps the most valuable ones that pay
    (:meth:`specdec.adaptive.VerifyCosts.best_tree`). Children are top choices, not samples —
    point-mass proposals, exact under sampling too (:func:`specdec.verify.verify_tree`)."""
    tokens: list[int] = []
    parents: list[int] = []
    estimates: list[float] = []
    frontier = [(-1, first_probs)]
    for level in range(depth):
        added = []
        for node, probs in frontier:
            top_probs, top_ids = top_candidates(probs, min(DRAFT_TREE_BRANCHES, probs.shape[-1]))
            candidates = top_ids.tolist() if vocab is None else vocab.tokens(top_ids)
            for prob, token in zip(top_probs.tolist(), candidates):
                value = (1.0 if node < 0 else estimates[node]) * prob
                if added and value < DRAFT_TREE_MIN_VALUE:
                    break
                added.append(len(tokens))
                tokens.append(token)
                parents.append(node)
                estimates.append(value)
        expand = sorted(added, key=lambda n: -estimates[n])[:width]
        expand = [n for n in expand if estimates[n] >= DRAFT_TREE_MIN_VALUE]
        if level + 1 == depth or not expand:
            break
        rows = yield from forward(expand, tokens, parents)
        if rows is None:
            break
        frontier = list(zip(expand, rows))
    return Draft(tokens=tokens, prefix_accept=estimates, parents=parents)


def draft_steps(
    logits: torch.Tensor,
    step: Callable[[int], Generator[ModelCall, torch.Tensor, torch.Tensor]],
    k: int,
    params: SamplingParams,
    generator: torch.Generator,
    confidence_threshold: float = 0.0,
    take_over: Callable[[list[int], int], list[int]] | None = None,
    constraint: GrammarConstraint | None = None,
    vocab: DraftVocab | None = None,
    shape: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = None,
    position: int | None = None,
) -> Generator[ModelCall, torch.Tensor, Draft]:
    """Up to ``k`` tokens, one model step each: ``logits`` follow the context, ``step(token)`` feeds a
    drafted token and returns the next logits (steps: the forward is yielded to whoever drives
    this, :mod:`specdec.calls`). Shared by every drafter that runs a model.

    Greedy drafts the argmax (q = None: a point mass, what greedy verification compares against);
    sampling draws from q = logits_to_probs(logits, params) — the same transform the target gets —
    and returns q for rejection sampling. ``confidence_threshold`` ends the round early once the
    draft's top probability falls below it (0 = never): that token is still proposed — its draft
    step is already paid, and one more verified token costs far less than a draft step — but no
    further step is drafted on it. ``take_over(drafted, room)``, asked before each further step,
    may return tokens that end the draft instead (a suffix table that is sure of the continuation:
    no step is paid for them); under sampling their q rows are point masses. ``constraint``
    (structured output) masks each step's logits with the grammar's mask after the tokens drafted
    so far — the mask the target's row gets — so q is the constrained draft distribution; drafting
    stops where the grammar allows nothing the draft can score. ``vocab``: the logits score its rows
    (``None``: the whole vocabulary) — greedy takes the argmax row's token; sampling and a grammar
    see the rows over the whole vocabulary (:class:`~specdec.drafters.vocab.DraftVocab`).
    ``shape(logits, drafted)``: the request's logit bias and penalties after the tokens drafted so
    far (:meth:`specdec.penalties.Penalties.for_context`), as the target's row gets them.
    ``position``: where the first drafted token goes in the sequence — a seeded sampled request drafts
    the seeded choice of q at each position, with the clocks the target's choice there reads
    (:mod:`specdec.seeded`), not a draw of its own.
    """
    tokens: list[int] = []
    probs: list[torch.Tensor] = []
    # sampling and grammars need each step's rows over the whole vocabulary; plain greedy maps its argmax
    spread = vocab if vocab is not None and (constraint is not None or shape is not None or not params.is_greedy) else None
    rows = vocab if spread is None else None
    for i in range(k):
        if spread is not None:
            logits = spread.full(logits)
        if constraint is not None:
            masked = constraint.mask_logits(logits, tokens)
            if masked is None:
                break
            logits = masked
        if shape is not None:
            logits = shape(logits, tokens)
        if params.is_greedy:
            row = int(greedy_ids(logits))
            token = row if rows is None else rows.token(row)
            top_prob = float(torch.softmax(logits, -1).max()) if confidence_threshold else 1.0
            q = None
        else:
            q = logits_to_probs(logits, params)
            if params.is_seeded_sampling and position is not None:
                assert params.seed is not None
                token = seeded_choice(q, params.seed, position + i)
            else:
                token = sample_from_probs(q, generator)
            top_prob = float(q.max())
        tokens.append(token)
        if q is not None:
            probs.append(q)
        if top_prob < confidence_threshold or i + 1 == k:
            break  # the draft is unsure: verifying now is cheaper than drafting on
        taken = take_over(tokens, k - len(tokens)) if take_over is not None else []
        if taken:
            tokens.extend(taken)
            if probs:  # sampling: point-mass q rows for the taken tokens
                probs.extend(point_mass(taken_token, logits.shape[-1], logits.device) for taken_token in taken)
            break
        logits = yield from step(token)
    return Draft(tokens=tokens, probs=torch.stack(probs) if probs else None)


def point_mass(token: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """q for a deterministic proposal: the verifier's min(1, p/q) and max(p − q, 0) then reduce to
    the point-mass rule (accept with p(token); on rejection resample from p without it)."""
    q = torch.zeros(vocab_size, device=device)
    q[token] = 1.0
    return q


def next_token_steps(backend: Backend, state, tokens: list[int], vocab_limit: int | None,  # noqa: ANN001
                     greedy: bool) -> Generator[ModelCall, torch.Tensor, torch.Tensor]:
    """Logits after the last of ``tokens`` (one draft forward). With a reduced draft vocabulary only
    ids < vocab_limit are scored (:func:`full_vocab`)."""
    logits = (yield ModelCall(backend, state, list(tokens), num_logits=1, vocab_limit=vocab_limit, role="draft"))[-1]
    return full_vocab(logits, backend.config.vocab_size, greedy)
