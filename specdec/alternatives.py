"""Token trees under sampling: a sampled chain with alternatives.

Under greedy decoding a model drafter's tree offers each node's likeliest tokens (EAGLE-2's dynamic
tree, :func:`specdec.drafters.model_steps.grow_tree`), point-mass proposals the target accepts when
one is its argmax. Under sampling a point mass x is accepted with the target's p(x) alone, while a
chain's token, *sampled* from the draft's q, is accepted with min(1, p/q) — about 1 − TV(p, q), far
more where both spread their mass: trees of point masses verified fewer tokens than chains of the
same size (0.81× the chain's τ at 4 nodes, temperature 1, HumanEval and MT-Bench; session 38).

So under sampling a drafter that can branch drafts its chain as usual (each token sampled from q),
and the engine hangs *alternatives* on it: at each position, the draft's likeliest other tokens as
point-mass siblings of the sampled one, tried on what its rejection leaves of p
(:func:`specdec.verify.verify_tree`). The chain is the tree's first-child path, so τ is at least the
chain's; an alternative is a second chance where the chain would have stopped. Alternatives are
leaves: nothing was drafted after them (that needs no draft forward at all).

Exactness needs one more thing: whether a sampled token is verified must not depend on the token
drawn. Here the whole chain is always verified (its length was chosen before drafting, as for any
chain), and only alternatives — point masses, exact whatever chose them — are picked by value.
"""

from __future__ import annotations

import torch

from specdec.adaptive import VerifyCosts
from specdec.drafters.base import Draft
from specdec.sampling import top_candidates

#: tokens offered per chain position: the sampled one and up to this many − 1 alternatives
ALTERNATIVE_BRANCHES = 3
#: the acceptance rate alternatives are valued with before a request has measured its own …
DEFAULT_ALPHA = 0.7
#: … which it moves away from after this many drafted tokens' worth of evidence
ALPHA_PRIOR_TOKENS = 8
#: what an alternative's win chance is scaled by before a request has measured its own (see
#: :func:`alternative_scale`): the draft model's alternatives won 0.65 (HumanEval) and 0.64
#: (MT-Bench) of what the estimate promised (t=1, 6 prompts × 2 seeds each, session 39; the 0.6
#: was set from a first 3-prompt look at 0.71 / 0.50) …
DEFAULT_SCALE = 0.6
#: … which it moves away from after this many promised wins' worth of evidence
SCALE_PRIOR_WINS = 2.0


def running_alpha(accepted: int, proposed: int) -> float:
    """The request's acceptance rate so far, drawn towards DEFAULT_ALPHA while it has drafted little —
    what values alternatives when no γ controller (``num_speculative_tokens=auto``) measures α.
    A fixed prior was wrong both ways: at HumanEval's α ≈ 0.9 it valued every alternative as if the
    chain failed three times as often, verifying ~8 nodes for no more τ (0.95× the chain's speed)."""
    return (accepted + DEFAULT_ALPHA * ALPHA_PRIOR_TOKENS) / (proposed + ALPHA_PRIOR_TOKENS)


def alternative_scale(wins: float, promised: float) -> float:
    """How the request's alternatives have won against what :func:`win_estimate` promised them
    (wins / promised, drawn towards DEFAULT_SCALE while little was promised). The estimate is
    q's share, but the rejection leaves p − q, and a draft close to the target leaves little of it
    on q's own next choices: session 38's alternatives passed the cost model ~3.5 per round and
    cost the chain 2–7 % of its speed."""
    return (wins + DEFAULT_SCALE * SCALE_PRIOR_WINS) / (promised + SCALE_PRIOR_WINS)


def win_estimate(q: torch.Tensor, chain_token: int, token: int) -> float:
    """``q [V]``: the draft distribution ``chain_token`` was sampled from → the estimated chance
    that ``token`` is accepted once ``chain_token`` was rejected: its share of q's other mass, standing
    in for what the rejection leaves to it."""
    return share_of_the_rest(float(q[token]), float(q[chain_token]))


def share_of_the_rest(token_q: float, chain_token_q: float) -> float:
    """:func:`win_estimate` from the two probabilities: q(token) / (1 − q(chain token)), at most 1."""
    return min(1.0, token_q / max(1.0 - chain_token_q, 1e-12))


def measured_wins(tree: Draft, chain_length: int, path: list[int]) -> tuple[int, float]:
    """One verified chain-with-alternatives → (alternatives that won: 0 or 1, the wins
    :func:`win_estimate` promised the alternatives that were tried). Only the alternatives at the
    position where the chain stopped were tried; each one's win is a separate outcome of the same
    rejection (the residual's draw), so their estimates add up to the expected number of wins."""
    assert tree.parents is not None and tree.node_probs is not None
    accepted = chain_nodes_in(path, chain_length)
    if accepted == chain_length:  # the whole chain held: no alternative was tried
        return 0, 0.0
    q = tree.node_probs[accepted]
    assert q is not None
    promised = sum(win_estimate(q, tree.tokens[accepted], tree.tokens[node])
                   for node in range(chain_length, len(tree)) if tree.parents[node] + 1 == accepted)
    return int(len(path) > accepted), promised


def with_alternatives(chain: Draft, max_nodes: int, alpha: float, verify_costs: VerifyCosts,
                      scale: float = DEFAULT_SCALE, clocks: torch.Tensor | None = None) -> Draft:
    """``chain``: a sampled chain (``probs [k, V]``: the q each token was drawn from) → a tree of
    the chain and the alternatives worth their verify cost, at most ``max_nodes`` nodes in all
    (never fewer than the chain's); the chain itself where no alternative pays. Nodes: the chain
    first (node i follows node i − 1), then the alternatives, each a leaf whose parent is the chain
    node before its position.

    Values (the estimated chance a node is reached and accepted, :meth:`VerifyCosts.best_length`):
    chain node i ``alpha^(i+1)``; an alternative y at position i ``alpha^i · (1 − alpha) ·
    min(1, scale · win_estimate)`` — the chain reached position i, its token x_i was rejected, and
    y won what the rejection left, as often as the request's alternatives have been measured to
    (``scale``, :func:`alternative_scale`).

    ``clocks [k, V]``: a seeded request's Exp(1) clocks at the chain's positions (:mod:`specdec.seeded`).
    Its chain token is the draft's argmax q/E, and the target commits its own argmax p/E, so the
    alternatives are the draft's runners-up under the same clocks, not q's likeliest: teacher-forced over
    6 prompts (t=0.7, 64 positions each, session 62) the chain's token was the target's at 80.5 % of
    positions, with one runner-up 89.6 % (q's likeliest other token: 88.2 %), with two 93.1 % (91.2 %)."""
    assert chain.probs is not None and chain.parents is None, "alternatives hang on a sampled chain"
    length = len(chain)
    chain_values = [alpha ** (i + 1) for i in range(length)]
    reached = [alpha ** position * (1.0 - alpha) for position in range(length)]
    # the most any alternative could be worth (win_estimate ≤ 1): where even that does not pay, the
    # vocabulary-wide top-k below is not worth running (~0.7 ms a position at 152 k ids, one core)
    ceiling = sorted((value * min(1.0, scale) for value in reached for _ in range(ALTERNATIVE_BRANCHES - 1)), reverse=True)
    if verify_costs.best_length(chain_values + ceiling[: max(0, max_nodes - length)], at_least=length) == length:
        return chain
    # one blocked top-k over the chain's rows [k, V] and one transfer to Python (a torch.topk per row cost ~3 ms a round)
    branches = min(ALTERNATIVE_BRANCHES, chain.probs.shape[-1])
    if clocks is None:
        top_probs, top_ids = top_candidates(chain.probs, branches)
    else:  # the noisy scores' runners-up (a seeded chain), valued by their q as any alternative
        top_ids = top_candidates(chain.probs / clocks, branches)[1]
        top_probs = chain.probs.gather(-1, top_ids)
    tokens = torch.as_tensor(chain.tokens, device=chain.probs.device).unsqueeze(-1)
    drawn_q = chain.probs.gather(-1, tokens).squeeze(-1).tolist()  # [k]: q of each sampled token
    candidates: list[tuple[float, int, int]] = []  # (value, position, token)
    for position, (token, ids, masses) in enumerate(zip(chain.tokens, top_ids.tolist(), top_probs.tolist())):
        others = [(other, mass) for other, mass in zip(ids, masses) if other != token and mass > 0.0]
        for other, mass in others[: ALTERNATIVE_BRANCHES - 1]:
            won = share_of_the_rest(mass, drawn_q[position])  # win_estimate, from the batched rows
            candidates.append((reached[position] * min(1.0, scale * won), position, other))
    candidates.sort(key=lambda c: -c[0])
    candidates = candidates[: max(0, max_nodes - length)]
    # the most expected committed tokens per second of verification, the whole chain always in
    count = verify_costs.best_length(chain_values + [value for value, _, _ in candidates], at_least=length)
    chosen = candidates[: count - length]
    if not chosen:  # nothing worth its cost: the chain itself (verified as a chain, the same RNG draws)
        return chain
    return Draft(tokens=chain.tokens + [token for _, _, token in chosen],
                 prefix_accept=chain_values + [value for value, _, _ in chosen],
                 parents=list(range(-1, length - 1)) + [position - 1 for _, position, _ in chosen],
                 node_probs=[*chain.probs] + [None] * len(chosen))


def chain_nodes_in(path: list[int], chain_length: int) -> int:
    """How many of an accepted ``path``'s nodes are the chain's (node numbers below
    ``chain_length``; an alternative can only end a path)."""
    return sum(1 for node in path if node < chain_length)
