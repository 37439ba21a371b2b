"""Tree speculation (issue 22): token trees verified in one target pass, exact under greedy and
sampling. The tree's shapes (specdec/tree.py), the one-pass forward (each node's logits equal to
decoding its path alone), the verifier's walk, greedy identity for every drafter that branches,
and the χ² certificate — with a wrong sibling rule that it catches."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.adaptive import VerifyCosts
from specdec.api import make_drafter
from specdec.certify import DISTRIBUTION_CONFIGS, distribution_check
from specdec.config import SpecConfig
from specdec.drafters.base import Draft
from specdec.engine import generate_ids
from specdec.rounds import fit_tree
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams, make_generator
from specdec.tree import TreeLayout, depths, ranked_nodes, subtree
from specdec.verify import verify_tree
from tests.test_engine import PROMPTS

#: a tree over the committed context: two first-level candidates (0, 1), node 0 with two children
#: (2, 3), node 2 with one (4) — the shape used throughout
PARENTS = [-1, -1, 0, 0, 2]


def test_tree_layout_positions_and_ancestor_mask():
    layout = TreeLayout(base=3, parents=[-1, *(p + 1 for p in PARENTS)])  # region: root token + 5 nodes
    assert depths(PARENTS) == [1, 1, 2, 2, 3]
    assert layout.positions(6).tolist() == [3, 4, 4, 5, 5, 6]
    mask = layout.mask(6)
    assert mask.shape == (6, 9) and mask[:, :3].all()  # every node sees the committed context
    region = mask[:, 3:].int().tolist()
    assert region[0] == [1, 0, 0, 0, 0, 0]  # the last committed token: itself
    assert region[3] == [1, 1, 0, 1, 0, 0]  # node 2: root, node 0, itself
    assert region[5] == [1, 1, 0, 1, 0, 1]  # node 4: root, 0, 2, itself — not its uncle 3 or node 1
    assert layout.mask(2).tolist() == mask[-2:].tolist()  # a level added to an existing region


def test_bad_trees_are_refused():
    with pytest.raises(ValueError, match="parent"):
        TreeLayout(0, [0])
    with pytest.raises(ValueError, match="parents"):
        Draft(tokens=[1, 2], parents=[-1])
    with pytest.raises(ValueError, match="node_probs"):
        Draft(tokens=[1], probs=torch.ones(1, 4) / 4, parents=[-1])
    with pytest.raises(ValueError, match="one entry"):
        Draft(tokens=[1, 2], parents=[-1, 0], node_probs=[torch.ones(4) / 4])
    with pytest.raises(ValueError, match="one entry"):
        Draft(tokens=[1], node_probs=[None])  # a chain carries q in probs
    with pytest.raises(SpecdecError, match="spec_tree"):
        SpecConfig(method="ngram", spec_tree=0)
    assert SpecConfig(method="ngram", spec_tree="5").max_tree_nodes == 5
    assert SpecConfig(method="ngram", num_speculative_tokens=4, spec_tree="auto").max_tree_nodes == 8
    chains = SpecConfig(method="ngram", spec_tree="off")
    assert chains.max_tree_nodes == chains.tree_nodes(greedy=True) == chains.tree_nodes(greedy=False) == 0
    auto = SpecConfig(method="ngram", num_speculative_tokens=4, spec_tree="auto")
    assert auto.tree_nodes(greedy=True) == auto.tree_nodes(greedy=False) == 8
    default = SpecConfig(method="ngram", num_speculative_tokens=4)  # spec_tree="greedy": trees for greedy requests only
    assert (default.spec_tree, default.max_tree_nodes) == ("greedy", 8)
    assert SpecConfig(method="ngram").num_speculative_tokens == "auto"  # γ=auto unless fixed: up to 16 nodes
    assert SpecConfig(method="ngram").max_tree_nodes == 16
    assert (default.tree_nodes(greedy=True), default.tree_nodes(greedy=False)) == (8, 0)
    amx_int8 = {1: 0.0758, 2: 0.0786, 4: 0.0831, 8: 0.0845}  # measured curves (session 42, AMX Xeon)
    int4 = {1: 0.0521, 2: 0.0550, 4: 0.0670, 8: 0.1071}  # ~10 % of a step per extra row: trees did not pay
    assert default.tree_nodes(greedy=True, verify_seconds=amx_int8) == 8
    assert default.tree_nodes(greedy=True, verify_seconds=int4) == 0
    assert auto.tree_nodes(greedy=True, verify_seconds=int4) == 8  # asked for explicitly: trees anyway
    # flat to 4 rows, ~9 % of a step per row beyond (int4 on the AMX Xeon, session 61): read to 4 rows it
    # passed and trees ran 0.94x the chain on HumanEval; read to the tree's 9 rows, chains
    flat_then_steep = {1: 0.0587, 2: 0.0587, 4: 0.0622, 8: 0.0836, 16: 0.1162}
    assert default.tree_nodes(greedy=True, verify_seconds=flat_then_steep) == 0
    assert SpecConfig(method="ngram", num_speculative_tokens=1).tree_nodes(greedy=True, verify_seconds=flat_then_steep) == 2


def test_ranking_keeps_every_prefix_a_tree_and_the_cost_model_picks_how_many():
    estimates = [0.9, 0.05, 0.6, 0.2, 0.5]
    assert ranked_nodes(PARENTS, estimates) == [0, 2, 4, 3, 1]
    assert ranked_nodes(PARENTS, [0.1, 0.05, 0.9, 0.2, 0.5])[:3] == [0, 2, 4]  # a child above its parent waits
    assert subtree(PARENTS, [0, 2, 4]) == [-1, 0, 1]
    flat = VerifyCosts({k: 1.0 for k in range(8)})  # a GPU: every node is worth verifying
    assert flat.best_tree(PARENTS, estimates, 8) == [0, 1, 2, 3, 4]
    assert flat.best_tree(PARENTS, estimates, 3) == [0, 2, 4]
    steep = VerifyCosts({k: 1.0 + 0.4 * k for k in range(8)})  # each verified token costs 0.4 steps
    assert steep.best_tree(PARENTS, estimates, 8) == [0, 2]  # (1 + .9 + .6) / 1.8 beats one more at .5


def test_fit_tree_keeps_what_fits_and_the_likeliest():
    draft = Draft(tokens=[5, 6, 7, 99, 8], prefix_accept=[0.9, 0.05, 0.6, 0.2, 0.5], parents=PARENTS)
    flat = VerifyCosts({k: 1.0 for k in range(8)})
    assert fit_tree(draft, 8, room=8, slots=20, verify_costs=flat, vocab_size=64) == [0, 1, 2, 4]  # 99: outside
    assert fit_tree(draft, 8, room=1, slots=20, verify_costs=flat, vocab_size=128) == [0, 1]  # depth ≤ room
    assert fit_tree(draft, 2, room=8, slots=20, verify_costs=flat, vocab_size=128) == [0, 2]
    assert fit_tree(draft, 8, room=8, slots=3, verify_costs=flat, vocab_size=128) == [0, 2]  # cache slots
    assert Draft(tokens=[5, 6, 7], parents=[-1, -1, 0]).clipped(2, 6) == Draft(tokens=[5], parents=[-1])


def test_verify_tree_greedy_follows_the_targets_argmax_through_any_branch():
    vocab = 10
    tokens = [3, 4, 5, 6, 7]
    logits = torch.zeros(6, vocab)
    for row, best in enumerate([4, 0, 0, 0, 1, 2]):  # root → 4 (node 1, a second choice), then 0
        logits[row, best] = 1.0
    assert verify_tree(tokens, PARENTS, logits, SamplingParams(temperature=0.0), make_generator(0)) == ([1], 0)
    for row, best in enumerate([3, 6, 0, 0, 0, 9]):  # 3 → 6 (node 3) → leaf: bonus from its row
        logits[row] = 0.0
        logits[row, best] = 1.0
    assert verify_tree(tokens, PARENTS, logits, SamplingParams(temperature=0.0), make_generator(0)) == ([0, 3], 0)


def test_verify_tree_sampling_never_emits_a_rejected_sibling():
    """Under sampling, a token emitted where every candidate was rejected is never one of them:
    their mass left the residual when they were rejected."""
    tokens, parents = [0, 1], [-1, -1]
    logits = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    generator = make_generator(1)
    emitted = [verify_tree(tokens, parents, logits, SamplingParams(temperature=1.0), generator) for _ in range(300)]
    assert {token for path, token in emitted if not path} == {2}
    assert {tuple(path) for path, _ in emitted} == {(), (0,), (1,)}


def test_row_wise_attention_reads_each_tree_row_over_its_visible_keys():
    """The batch-invariant Python attention (float weights, set_batch_invariant): a tree's rows —
    causal ones (the first-child chain) over their prefix only, others under the ancestor mask —
    equal plain masked attention computed row by row."""
    from specdec.models.config import ModelConfig
    from specdec.models.transformer import Attention

    cfg = ModelConfig(arch="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=64)
    attention = Attention(cfg, 0)
    base = 6
    layout = TreeLayout(base=base, parents=[-1, *(p + 1 for p in PARENTS)])
    seq = len(PARENTS) + 1
    mask = layout.mask(seq)[:, : base + seq]
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(cfg.num_heads, seq, cfg.head_dim, generator=gen)
    keys = torch.randn(cfg.num_kv_heads, base + seq, cfg.head_dim, generator=gen)
    values = torch.randn(cfg.num_kv_heads, base + seq, cfg.head_dim, generator=gen)
    out = attention._row_wise(q, keys, values, base, mask)  # [T, heads * D]
    group = cfg.num_heads // cfg.num_kv_heads
    for row in range(seq):
        visible = mask[row].nonzero().flatten()
        qi = q[:, row].reshape(cfg.num_kv_heads, group, cfg.head_dim)
        scores = torch.matmul(qi, keys[:, visible].transpose(1, 2)) * cfg.head_dim**-0.5
        expected = torch.matmul(torch.softmax(scores, -1), values[:, visible]).reshape(-1)
        torch.testing.assert_close(out[row], expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(attention._row_wise(q, keys, values, base, None)[0], out[0])  # the root row is causal


@pytest.fixture(scope="module", params=["none", "int8", "int4"])
def target_mode(request, tiny_dirs, int4_kernel):
    return specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize=request.param)


def test_tree_forward_scores_every_node_as_its_path_alone(target_mode):
    """One forward over a tree (positions by depth, ancestor mask) gives each node the logits of
    decoding its path alone: bit-identical in the int8/int4 modes (row by row layers, attention over
    the same keys in the same order), to float rounding with float weights."""
    backend = target_mode.backend
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(0, 512, (12,), generator=gen).tolist()
    nodes = torch.randint(0, 512, (len(PARENTS),), generator=gen).tolist()
    state = backend.new_state(64)
    backend.forward(state, context[:-1])
    tree = TreeLayout(len(context) - 1, [-1, *(p + 1 for p in PARENTS)])
    logits = backend.forward(state, [context[-1], *nodes], tree=tree)
    assert state.seq_len == len(context) + len(PARENTS)
    for node in range(-1, len(PARENTS)):
        path = [] if node < 0 else [n for n in range(node + 1) if n in _ancestors(node)]
        alone_state = backend.new_state(64)
        alone = backend.forward(alone_state, context + [nodes[n] for n in path])[-1]
        if backend.dtype_name in ("int8", "int4"):
            assert torch.equal(logits[node + 1], alone), node
        else:
            torch.testing.assert_close(logits[node + 1], alone, rtol=1e-4, atol=1e-4)
    # keep the path 0 → 2 → 4: the cache equals the path's own cache
    state.keep([0, 1, 3, 5], len(context) - 1)
    alone_state = backend.new_state(64)
    backend.forward(alone_state, context + [nodes[0], nodes[2], nodes[4]])
    assert state.seq_len == alone_state.seq_len
    if backend.dtype_name in ("int8", "int4"):
        assert torch.equal(state.k[:, :, : state.seq_len], alone_state.k[:, :, : state.seq_len])


def _ancestors(node: int) -> set[int]:
    result = set()
    while node >= 0:
        result.add(node)
        node = PARENTS[node]
    return result


TREE_METHODS = [("draft_model", "other"), ("draft_model", "same"), ("suffix", None), ("ngram", None), ("draft_suffix", "same")]


@pytest.mark.parametrize("method,draft_kind", TREE_METHODS)
@pytest.mark.parametrize("tree", [3, "auto"])
def test_greedy_tree_speculation_equals_plain(target_mode, tiny_draft, method, draft_kind, tree):
    target = target_mode
    draft = {"other": tiny_draft, "same": target, None: None}[draft_kind]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for prompt in PROMPTS[:3]:
        ids = target.tokenizer.encode(prompt)
        plain = generate_ids(target.backend, ids, params, None, SpecConfig(), target.tokenizer, make_generator(0))
        spec = SpecConfig(method=method, num_speculative_tokens=4, spec_tree=tree)
        generator = make_generator(0)
        drafter = make_drafter(target, spec, params, generator, len(ids) + 60, draft)
        out = generate_ids(target.backend, ids, params, drafter, spec, target.tokenizer, generator)
        assert out.token_ids == plain.token_ids, (prompt, method, tree)
        assert out.stats.tree_rounds > 0
        assert out.stats.tree_nodes / out.stats.tree_rounds <= spec.max_tree_nodes


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_the_default_grows_trees_for_greedy_requests_and_chains_for_sampled_ones(tiny_target, tiny_draft, method):
    """spec_tree's default ("greedy"): a greedy request verifies trees (and stays plain decoding's
    output); a sampled one drafts chains without alternatives, as spec_tree="off" does — the same
    tokens from the same seed."""
    draft = tiny_draft if method == "draft_model" else None
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = specdec.generate(tiny_target, PROMPTS[0], greedy)
    out = specdec.generate(tiny_target, PROMPTS[0], greedy, draft=draft, spec=SpecConfig(method=method))
    assert out.token_ids == plain.token_ids and out.stats.tree_rounds > 0
    sampled = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True, seed=3)
    default = specdec.generate(tiny_target, PROMPTS[0], sampled, draft=draft, spec=SpecConfig(method=method))
    chains = specdec.generate(tiny_target, PROMPTS[0], sampled, draft=draft,
                              spec=SpecConfig(method=method, spec_tree="off"))
    auto = specdec.generate(tiny_target, PROMPTS[0], sampled, draft=draft,
                            spec=SpecConfig(method=method, spec_tree="auto"))
    assert auto.stats.tree_rounds > 0  # what the default must not do under sampling
    assert default.stats.tree_rounds == 0 and default.stats.alternative_promised == 0
    assert default.token_ids == chains.token_ids


def test_tree_stats_count_nodes_and_rounds_won_by_a_second_branch():
    from specdec.stats import Stats

    stats = Stats()
    stats.record_tree(5, [0, 2, 4], PARENTS)  # first children all the way
    stats.record_tree(5, [0, 3], PARENTS)  # node 3 is node 0's second child
    stats.record_tree(5, [1], PARENTS)  # the root's second candidate
    stats.record_tree(5, [], PARENTS)
    summary = stats.to_dict()
    assert (summary["tree_rounds"], summary["tree_nodes_per_round"], summary["tree_branch_wins"]) == (4, 5.0, 2)


@pytest.mark.parametrize("method", ["draft_model", "suffix", "ngram"])
def test_structured_output_with_trees_on_is_exact_and_valid(tiny_target, tiny_draft, method):
    """A grammar cuts and extends drafts as chains: with --spec-tree on, a request with structured
    output drafts chains (tree_nodes_for) and its output is plain decoding's."""
    pytest.importorskip("xgrammar")
    from specdec.structured import StructuredOutput

    regex = r"[a-z]{2,6}@[a-z]{2,6}\.(com|org)"
    params = SamplingParams(temperature=0.0, max_tokens=40, structured=StructuredOutput(regex=regex))
    plain = specdec.generate(tiny_target, "email: ", params)
    out = specdec.generate(tiny_target, "email: ", params, draft=tiny_draft,
                           spec=SpecConfig(method=method, num_speculative_tokens=4, spec_tree=6))
    assert out.token_ids == plain.token_ids and out.stats.tree_rounds == 0


@pytest.mark.parametrize("method", ["draft_model", "ngram", "suffix", "eagle", "medusa"])
def test_tree_sampling_certificate(method, one_thread):
    """χ² of the first three tokens' joint distribution under tree speculation vs the target's exact one."""
    result = distribution_check(method, "T=0.7,top-k=4", DISTRIBUTION_CONFIGS["T=0.7,top-k=4"], samples=1500,
                                spec_options={"spec_tree": 6})
    assert result.passed, result.detail


def _wrong_sibling_rule(tokens, parents, logits, params, generator):  # noqa: ANN001, ANN202
    """verify_tree with the classic mistake: each sibling accepted with its own p(x), forgetting
    that the siblings tried before it took their mass out of the residual."""
    from specdec.sampling import logits_to_probs, sample_rows

    probs = logits_to_probs(logits, params).double()
    path, node, row = [], -1, 0
    while True:
        kids = [c for c, p in enumerate(parents) if p == node]
        accepted = next((c for c in kids if float(torch.rand((), generator=generator, dtype=torch.float64))
                         < probs[row, tokens[c]]), None)
        if accepted is None:
            residual = probs[row].clone()
            residual[[tokens[c] for c in kids]] = 0.0
            return path, int(sample_rows(residual if residual.sum() > 0 else probs[row], generator))
        path.append(accepted)
        node, row = accepted, accepted + 1


@pytest.mark.parametrize("rule,exact", [(verify_tree, True), (_wrong_sibling_rule, False)])
def test_tree_verification_chi_square(rule, exact):
    """The verifier alone, 20000 trials on one tree whose siblings are the target's own top choices
    (where a wrong sibling rule shows most): the first emitted token must follow p(row 0) and,
    after node 0, the next one p(row 1). The χ² test passes the rule and fails the wrong one."""
    from specdec.stats_tests import chi_square_pvalue

    vocab, trials = 8, 20000
    logits = torch.randn(len(PARENTS) + 1, vocab, generator=torch.Generator().manual_seed(4))
    params = SamplingParams(temperature=1.0)
    probs = torch.softmax(logits, -1)
    top = [probs[row].argsort(descending=True).tolist() for row in range(len(PARENTS) + 1)]
    rank_of = {}  # each node is its parent row's next-best token not yet used by a sibling
    tokens = []
    for node, parent in enumerate(PARENTS):
        rank_of[parent] = rank_of.get(parent, -1) + 1
        tokens.append(top[parent + 1][rank_of[parent]])
    generator = make_generator(0)
    first, second = [0] * vocab, [0] * vocab
    for _ in range(trials):
        path, token = rule(tokens, PARENTS, logits, params, generator)
        emitted = [tokens[n] for n in path] + [token]
        first[emitted[0]] += 1
        if path[:1] == [0]:
            second[emitted[1]] += 1
    p_first = chi_square_pvalue(first, probs[0].tolist())
    p_second = chi_square_pvalue(second, probs[1].tolist())
    assert (min(p_first, p_second) > 1e-3) == exact, (p_first, p_second)


def test_draft_model_cache_holds_exactly_the_accepted_path_after_every_tree(tiny_dirs, monkeypatch):
    """After each tree round the draft model's cache must be the cache of the tokens it lists as
    cached — the accepted path's forwarded nodes moved down behind the context — or its next
    drafts are made from a wrong context (still exact output, silently lower acceptance)."""
    from specdec.drafters import model_steps
    from specdec.drafters.draft_model import DraftModelDrafter

    monkeypatch.setattr(model_steps, "DRAFT_TREE_MIN_VALUE", 0.0)  # the tiny model is unsure: grow full depth
    target = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="int8")
    draft = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="int8")  # accepts a lot
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    spec = SpecConfig(method="draft_model", num_speculative_tokens=4, spec_tree=8)
    checked = []

    class CheckedTreeDrafter(DraftModelDrafter):
        def accepted_path(self, path, next_token):  # noqa: ANN001, ANN202
            forwarded_before = set(self.tree_slots)
            super().accepted_path(path, next_token)
            assert self.state.seq_len == len(self.cached)
            fresh = self.backend.new_state(self.state.max_seq_len)
            self.backend.forward(fresh, self.cached)
            assert torch.equal(fresh.k[:, :, : fresh.seq_len], self.state.k[:, :, : fresh.seq_len])
            checked.append(len([n for n in path if n in forwarded_before]))

    for prompt in PROMPTS[:2]:
        ids = target.tokenizer.encode(prompt)
        generator = make_generator(0)
        drafter = make_drafter(target, spec, params, generator, len(ids) + 60, draft)
        drafter.__class__ = CheckedTreeDrafter
        out = generate_ids(target.backend, ids, params, drafter, spec, target.tokenizer, generator)
        assert out.stats.tree_rounds > 0
    assert max(checked) >= 2, checked  # paths through several forwarded nodes were moved down
