"""Token trees under sampling: a sampled chain with point-mass alternatives (specdec.alternatives).

The verifier's mixed rule (a sampled child by min(1, r/q), its siblings as point masses on what is
left) against the target's distribution with a χ² test — and a selection that looks at the sampled
token, which the test shows biased; the tree the engine builds; and end to end on the tiny model."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.adaptive import VerifyCosts
from specdec.alternatives import (ALTERNATIVE_BRANCHES, DEFAULT_ALPHA, DEFAULT_SCALE, alternative_scale, chain_nodes_in,
                                  measured_wins, running_alpha, win_estimate, with_alternatives)
from specdec.drafters.base import Draft
from specdec.sampling import SamplingParams, make_generator, sample_from_probs
from specdec.stats_tests import chi_square_pvalue
from specdec.verify import verify_tree

VOCAB = 8


def _first_tokens(peek_at_sample: bool, trials: int = 20000) -> tuple[list[int], list[float]]:
    """Emitted first tokens over ``trials`` rounds of a one-level tree: a token sampled from q with
    q, then q's two likeliest other tokens as point masses. ``peek_at_sample``: the classic mistake
    of a drafter that reranks what it sampled — an unlikely sample is left out of the tree."""
    torch.manual_seed(0)
    target_logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(1))
    q = torch.softmax(torch.randn(VOCAB, generator=torch.Generator().manual_seed(2)), -1)
    params = SamplingParams(temperature=1.0)
    draw, verify_gen = make_generator(3), make_generator(4)
    counts = [0] * VOCAB
    for _ in range(trials):
        sampled = sample_from_probs(q, draw)
        others = [int(t) for t in q.argsort(descending=True) if int(t) != sampled][:2]
        if peek_at_sample and float(q[sampled]) < 0.15:
            tokens, node_probs = others, [None, None]
        else:
            tokens, node_probs = [sampled, *others], [q, None, None]
        path, token = verify_tree(tokens, [-1] * len(tokens), target_logits[: len(tokens) + 1], params, verify_gen,
                                  node_probs)
        counts[tokens[path[0]] if path else token] += 1
    return counts, torch.softmax(target_logits[0], -1).tolist()


@pytest.mark.parametrize("peek,exact", [(False, True), (True, False)])
def test_sampled_child_then_point_masses_is_exact_unless_the_sample_chose_the_tree(peek, exact):
    counts, p = _first_tokens(peek)
    assert (chi_square_pvalue(counts, p) > 1e-3) == exact, chi_square_pvalue(counts, p)


def _chain(length: int = 3) -> Draft:
    q = torch.softmax(torch.randn(length, VOCAB, generator=torch.Generator().manual_seed(5)), -1)
    tokens = [int(torch.multinomial(row, 1, generator=torch.Generator().manual_seed(i))) for i, row in enumerate(q)]
    return Draft(tokens=tokens, probs=q)


def test_alternatives_hang_on_the_whole_chain_as_leaves():
    chain = _chain()
    tree = with_alternatives(chain, max_nodes=20, alpha=0.7, verify_costs=VerifyCosts())  # flat costs: all pay
    assert tree.tokens[:3] == chain.tokens and tree.parents[:3] == [-1, 0, 1]
    assert all(torch.equal(a, b) for a, b in zip(tree.node_probs[:3], chain.probs))
    alternatives = list(range(3, len(tree.tokens)))
    assert len(alternatives) == 3 * (ALTERNATIVE_BRANCHES - 1)
    for node in alternatives:
        position = tree.parents[node] + 1
        assert tree.node_probs[node] is None and node not in tree.parents  # point masses, leaves
        assert tree.tokens[node] != chain.tokens[position]
        assert float(chain.probs[position][tree.tokens[node]]) > 0
    siblings = {(tree.parents[n], tree.tokens[n]) for n in alternatives}
    assert len(siblings) == len(alternatives)  # distinct at each position
    assert chain_nodes_in([0, 1, 7], 3) == 2


def test_a_seeded_chains_alternatives_are_the_drafts_runners_up_under_the_same_clocks():
    """A seeded chain's token is the draft's argmax q/E, and the target commits its argmax p/E with the same
    clocks E: the siblings worth verifying are the draft's next noisy choices, which need not be q's likeliest."""
    q = torch.tensor([[0.5, 0.3, 0.15, 0.05, 0.0, 0.0, 0.0, 0.0]])
    clocks = torch.tensor([[1.0, 5.0, 1.0, 0.01, 1.0, 1.0, 1.0, 1.0]])  # q/E: token 3, then 0, then 2 (1 far behind)
    chain = Draft(tokens=[3], probs=q)
    by_q = with_alternatives(chain, max_nodes=3, alpha=0.5, verify_costs=VerifyCosts())
    by_noise = with_alternatives(chain, max_nodes=3, alpha=0.5, verify_costs=VerifyCosts(), clocks=clocks)
    assert sorted(by_q.tokens[1:]) == [0, 1] and sorted(by_noise.tokens[1:]) == [0, 2]
    assert by_noise.parents == [-1, -1, -1] and by_noise.node_probs[1:] == [None, None]


def test_alternatives_respect_the_budget_and_the_verify_cost_but_never_cut_the_chain():
    chain = _chain()
    assert len(with_alternatives(chain, max_nodes=5, alpha=0.7, verify_costs=VerifyCosts()).tokens) == 5
    assert with_alternatives(chain, max_nodes=2, alpha=0.7, verify_costs=VerifyCosts()) is chain
    steep = VerifyCosts.from_measured({k: 1.0 + k for k in range(1, 12)})  # each node costs a whole step
    assert with_alternatives(chain, max_nodes=20, alpha=0.7, verify_costs=steep) is chain  # a chain, verified as one


def _alternatives_row_by_row(chain: Draft, max_nodes: int, alpha: float, costs: VerifyCosts, scale: float) -> list[tuple[int, int]]:
    """The selection written the slow, obvious way (a top-k and win_estimate per chain row): the
    batched one must choose the same (parent, token) leaves."""
    candidates = []
    for position, (token, q) in enumerate(zip(chain.tokens, chain.probs)):
        top = torch.topk(q, ALTERNATIVE_BRANCHES)
        others = [int(t) for t, p in zip(top.indices, top.values) if int(t) != token and float(p) > 0.0]
        for other in others[: ALTERNATIVE_BRANCHES - 1]:
            value = alpha ** position * (1 - alpha) * min(1.0, scale * win_estimate(q, token, other))
            candidates.append((value, position, other))
    candidates = sorted(candidates, key=lambda c: -c[0])[: max_nodes - len(chain)]
    values = [alpha ** (i + 1) for i in range(len(chain))] + [c[0] for c in candidates]
    count = costs.best_length(values, at_least=len(chain))
    return [(position - 1, other) for _, position, other in candidates[: count - len(chain)]]


@pytest.mark.parametrize("alpha,scale,step", [(0.7, 0.6, 0.0), (0.5, 1.0, 0.05), (0.9, 0.3, 0.02), (0.95, 0.6, 0.3)])
def test_batched_selection_equals_the_row_by_row_one(alpha, scale, step):
    chain = _chain(4)
    costs = VerifyCosts.from_measured({k: 1.0 + step * k for k in range(1, 14)})
    tree = with_alternatives(chain, 12, alpha, costs, scale=scale)
    expected = _alternatives_row_by_row(chain, 12, alpha, costs, scale)
    chosen = [] if tree is chain else list(zip(tree.parents[4:], tree.tokens[4:]))
    assert chosen == expected


def test_alternatives_are_valued_with_the_requests_own_acceptance():
    assert running_alpha(0, 0) == DEFAULT_ALPHA
    assert abs(running_alpha(900, 1000) - 0.9) < 0.01 and running_alpha(4, 4) > DEFAULT_ALPHA
    chain = _chain()
    costs = VerifyCosts.from_measured({k: 1.0 + 0.05 * k for k in range(1, 12)})  # nodes cost a little
    sure, unsure = (len(with_alternatives(chain, 20, alpha, costs).tokens) for alpha in (0.99, 0.5))
    assert sure < unsure  # an alternative only pays where the chain is often rejected


def test_measured_wins_count_only_the_alternatives_tried_where_the_chain_stopped():
    chain = _chain()
    tree = with_alternatives(chain, max_nodes=20, alpha=0.7, verify_costs=VerifyCosts())
    at = {position: [n for n in range(3, len(tree)) if tree.parents[n] + 1 == position] for position in range(3)}
    assert measured_wins(tree, 3, [0, 1, 2]) == (0, 0.0)  # the chain held: nothing tried
    promised_1 = sum(win_estimate(chain.probs[1], chain.tokens[1], tree.tokens[n]) for n in at[1])
    assert measured_wins(tree, 3, [0]) == (0, pytest.approx(promised_1))  # stopped at 1, no alternative won
    assert measured_wins(tree, 3, [0, at[1][1]]) == (1, pytest.approx(promised_1))  # the second one won
    assert measured_wins(tree, 3, [at[0][0]])[0] == 1


def test_alternatives_are_valued_by_how_they_have_won():
    assert alternative_scale(0, 0) == DEFAULT_SCALE
    assert alternative_scale(20, 100) < 0.3 and alternative_scale(50, 50) > 0.9
    chain = _chain()
    costs = VerifyCosts.from_measured({k: 1.0 + 0.05 * k for k in range(1, 12)})
    trusted, measured_poor = (len(with_alternatives(chain, 20, 0.7, costs, scale=scale).tokens) for scale in (1.0, 0.1))
    assert measured_poor < trusted


def test_measured_wins_match_what_the_verifier_does():
    """Over many sampled one-token chains with two alternatives each, the wins measured_wins counts
    equal the analytic expectation: P(chain token rejected) × the residual max(p − q, 0)'s mass on the
    alternatives (within 4 binomial sd) — what the win rate is calibrated against is real."""
    # a draft overconfident in token 0: its next choices are where the target has mass left over
    p = torch.tensor([0.10, 0.30, 0.25, 0.20, 0.10, 0.05])
    q = torch.tensor([0.50, 0.20, 0.15, 0.10, 0.03, 0.02])
    target_logits = p.log().expand(4, -1)
    residual = (p - q).clamp(min=0)
    residual = residual / residual.sum()
    params, draw, verify_gen = SamplingParams(temperature=1.0), make_generator(13), make_generator(14)
    trials, wins, promised, expected = 6000, 0, 0.0, 0.0
    for _ in range(trials):
        chain = Draft(tokens=[sample_from_probs(q, draw)], probs=q.unsqueeze(0))
        tree = with_alternatives(chain, max_nodes=3, alpha=0.5, verify_costs=VerifyCosts())
        assert len(tree) == 3
        path, _ = verify_tree(tree.tokens, tree.parents, target_logits, params, verify_gen, tree.node_probs)
        won, promise = measured_wins(tree, 1, path)
        wins, promised = wins + won, promised + promise
        x = tree.tokens[0]
        expected += float(1 - torch.clamp(p[x] / q[x], max=1.0)) * float(residual[tree.tokens[1:]].sum())
    assert expected > 500 and abs(wins - expected) < 4 * expected ** 0.5, (wins, expected)
    assert promised > 0


@pytest.mark.parametrize("method", ["draft_model", "eagle"])
def test_sampled_requests_with_trees_on_verify_chains_with_alternatives(tiny_target, tiny_draft, method, tmp_path):
    """--spec-tree under sampling: the model drafter drafts its sampled chain and the engine hangs
    alternatives on it (tree rounds with more nodes than the chain, alternatives sometimes win);
    a seed reproduces the output."""
    from specdec.certify import _tiny_head

    params = SamplingParams(temperature=1.0, max_tokens=48, seed=7, ignore_eos=True)
    options = {"drafter_path": _tiny_head(tiny_target.backend, method, 0, tmp_path)} if method == "eagle" else {}
    spec = SpecConfig(method=method, num_speculative_tokens=3, spec_tree=9, **options)
    runs = [specdec.generate(tiny_target, "def add(a, b):", params, draft=tiny_draft, spec=spec) for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids
    stats = runs[0].stats
    assert stats.tree_rounds > 0 and stats.tree_nodes > stats.proposed_tokens
    assert stats.alternative_promised > 0 and stats.to_dict()["alternative_wins"] == stats.alternative_wins
    assert len(runs[0].token_ids) == 48


SpecConfig = specdec.SpecConfig
