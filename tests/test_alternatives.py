"""Token trees under sampling: a sampled chain with point-mass alternatives (specdec.alternatives).

The verifier's mixed rule (a sampled child by min(1, r/q), its siblings as point masses on what is
left) against the target's distribution with a χ² test — and a selection that looks at the sampled
token, which the test shows biased; the tree the engine builds; and end to end on the tiny model."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.adaptive import VerifyCosts
from specdec.alternatives import ALTERNATIVE_BRANCHES, DEFAULT_ALPHA, chain_nodes_in, running_alpha, with_alternatives
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


def test_alternatives_respect_the_budget_and_the_verify_cost_but_never_cut_the_chain():
    chain = _chain()
    assert len(with_alternatives(chain, max_nodes=5, alpha=0.7, verify_costs=VerifyCosts()).tokens) == 5
    assert with_alternatives(chain, max_nodes=2, alpha=0.7, verify_costs=VerifyCosts()) is chain
    steep = VerifyCosts.from_measured({k: 1.0 + k for k in range(1, 12)})  # each node costs a whole step
    assert with_alternatives(chain, max_nodes=20, alpha=0.7, verify_costs=steep) is chain  # a chain, verified as one


def test_alternatives_are_valued_with_the_requests_own_acceptance():
    assert running_alpha(0, 0) == DEFAULT_ALPHA
    assert abs(running_alpha(900, 1000) - 0.9) < 0.01 and running_alpha(4, 4) > DEFAULT_ALPHA
    chain = _chain()
    costs = VerifyCosts.from_measured({k: 1.0 + 0.05 * k for k in range(1, 12)})  # nodes cost a little
    sure, unsure = (len(with_alternatives(chain, 20, alpha, costs).tokens) for alpha in (0.99, 0.5))
    assert sure < unsure  # an alternative only pays where the chain is often rejected


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
    assert len(runs[0].token_ids) == 48


SpecConfig = specdec.SpecConfig
