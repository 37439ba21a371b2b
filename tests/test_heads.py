"""Heads on the target's features (EAGLE, Medusa): the feature store in the target's cache, the
drafters' exactness, their errors, and training (`specdec train-drafter`).

The χ² sampling certificate for both runs in tests/test_certify.py (every registered method, an
untrained head on the tiny model); here: greedy identity, the feature store, clear errors, and that
training makes a head that the target accepts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import specdec
from specdec.cli import main
from specdec.config import SpecConfig
from specdec.errors import SpecdecError, WeightsError
from specdec.models.head_files import load_head, save_head
from specdec.models.heads import EagleHead, HeadConfig, MedusaHeads
from specdec.sampling import SamplingParams
from specdec.train.data import Document, teacher_forced, token_sequences
from specdec.train.loop import TrainConfig, evaluate, train_head
from specdec.train.target_parts import TargetParts, float_head_rows
from specdec.tree import depths
from tests.corpus_fixtures import module_corpus

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
PROMPTS = ["def fibonacci(n):", "The quick brown fox jumps over the lazy dog. The quick"]


def random_head(target, draft_vocab_size: int = 0, seed: int = 0, scale: float = 0.2, kind: str = "eagle"):
    torch.manual_seed(seed)
    config = HeadConfig.for_target(target.config, draft_vocab_size=draft_vocab_size, kind=kind)
    return (EagleHead(config) if kind == "eagle" else MedusaHeads(config)).init_residual(scale)


@pytest.fixture(scope="module")
def head_dir(tiny_target, tmp_path_factory) -> Path:
    return save_head(random_head(tiny_target, draft_vocab_size=300), tmp_path_factory.mktemp("eagle"))


@pytest.fixture(scope="module")
def medusa_dir(tiny_target, tmp_path_factory) -> Path:
    return save_head(random_head(tiny_target, draft_vocab_size=300, kind="medusa", scale=0.3), tmp_path_factory.mktemp("medusa"))


@pytest.fixture(scope="module")
def int8_target(tiny_dirs):
    return specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="int8")


def periodic_data(target, count: int, length: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    """Teacher-forced features of sequences that repeat a random 5-token pattern: learnable."""
    generator = torch.Generator().manual_seed(seed)
    sequences = []
    for _ in range(count):
        lead = torch.randint(3, 500, (4,), generator=generator).tolist()
        pattern = torch.randint(3, 500, (5,), generator=generator).tolist()
        sequences.append((lead + pattern * length)[:length])
    return features_of(target, sequences)


def features_of(target, sequences: list[list[int]]) -> dict[str, torch.Tensor]:
    """Training rows (equal lengths) as :func:`specdec.train.data.extract_features` writes them."""
    tokens, features, target_ids = [], [], []
    for seq in sequences:
        feats, greedy = teacher_forced(target.backend, seq)
        tokens.append(torch.tensor(seq, dtype=torch.int32))
        features.append(feats.half())
        target_ids.append(greedy.to(torch.int32))
    return {"tokens": torch.stack(tokens), "features": torch.stack(features), "target_ids": torch.stack(target_ids)}


# --- the target's features, kept slot by slot in its cache -------------------------------------------

@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_features_are_the_final_hidden_states_of_each_cached_position(tiny_dirs, quantize):
    model = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize=quantize)
    backend, decoder = model.backend, model.backend.decoder
    ids = list(range(5, 25))
    state = backend.new_state(32)
    state.record_features(model.config.hidden_size)
    _, hidden = backend.forward(state, ids, return_hidden=True)
    assert torch.equal(decoder.model.norm(state.features[: len(ids)]), hidden)  # before the norm, every row
    # rows written by a later chunk land at their own slots; truncate + rewrite replaces them
    first = state.features[:20].clone()
    state.truncate(15)
    backend.forward(state, ids[15:])
    assert torch.equal(state.features[:15], first[:15])  # untouched below the truncation
    alone = backend.new_state(32)
    alone.record_features(model.config.hidden_size)
    backend.forward(alone, ids[:15])
    backend.forward(alone, ids[15:])
    if quantize == "int8":  # batch-invariant: the same bits whatever the chunking
        assert torch.equal(state.features[:20], alone.features[:20])
    else:  # float GEMMs round differently for 20 and 15 rows on some CPUs (MKL's AVX-512 kernels here)
        torch.testing.assert_close(state.features[:20], alone.features[:20], rtol=1e-4, atol=1e-4)


def test_keep_moves_the_features_with_the_keys_and_values(tiny_target):
    state = tiny_target.backend.new_state(16)
    state.record_features(tiny_target.config.hidden_size)
    tiny_target.backend.forward(state, list(range(10, 20)))
    before = state.features.clone()
    state.keep([0, 3, 5], 4)
    assert state.seq_len == 7
    assert torch.equal(state.features[4:7], before[[4, 7, 9]])
    assert torch.equal(state.features[:4], before[:4])


def test_batched_forward_writes_each_requests_features_as_alone(int8_target):
    backend = int8_target.backend
    hidden = int8_target.config.hidden_size
    states, alone = [backend.new_state(32) for _ in range(3)], [backend.new_state(32) for _ in range(3)]
    chunks = [list(range(3, 12)), [40], list(range(60, 64))]
    for state, other in zip(states, alone):
        state.record_features(hidden)
        other.record_features(hidden)
    backend.forward_batch([(state, chunk, None, None) for state, chunk in zip(states, chunks)])
    for other, chunk in zip(alone, chunks):
        backend.forward(other, chunk)
    for state, other, chunk in zip(states, alone, chunks):
        assert torch.equal(state.features[: len(chunk)], other.features[: len(chunk)])


def test_a_cache_records_nothing_unless_asked(tiny_target):
    state = tiny_target.backend.new_state(8)
    tiny_target.backend.forward(state, [1, 2, 3])
    assert state.features is None


# --- the drafter: exact, whatever the head --------------------------------------------------------------

@pytest.mark.parametrize("method", ["eagle", "medusa"])
@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_greedy_output_is_plain_decodings(tiny_dirs, head_dir, medusa_dir, quantize, method):
    target = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize=quantize)
    path = head_dir if method == "eagle" else medusa_dir
    for gamma in (1, 4, "auto"):
        spec = SpecConfig(method=method, drafter_path=str(path), num_speculative_tokens=gamma)
        for prompt in PROMPTS:
            plain = specdec.generate(target, prompt, GREEDY)
            out = specdec.generate(target, prompt, GREEDY, spec=spec)
            assert out.token_ids == plain.token_ids
            assert out.stats.method == method
            if gamma != "auto":
                assert out.stats.proposed_tokens > 0


@pytest.mark.parametrize("method", ["eagle", "medusa"])
@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_head_trees_are_exact(tiny_dirs, head_dir, medusa_dir, quantize, method):
    """--spec-tree with a trained head: EAGLE forwards each level's nodes through the head together
    (tree mask over its cache), Medusa branches each level from its block's distribution; the target
    verifies the tree and the output is plain decoding's."""
    target = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize=quantize)
    path = head_dir if method == "eagle" else medusa_dir
    for tree in (6, "auto"):
        spec = SpecConfig(method=method, drafter_path=str(path), num_speculative_tokens=4, spec_tree=tree)
        for prompt in PROMPTS:
            plain = specdec.generate(target, prompt, GREEDY)
            out = specdec.generate(target, prompt, GREEDY, spec=spec)
            assert out.token_ids == plain.token_ids, (prompt, tree)
            assert out.stats.tree_rounds > 0


@torch.no_grad()
def test_eagle_graph_step_computes_the_eager_step(tiny_target, head_dir):
    """The CUDA-graph form of an EAGLE chain step (token, position and slot from device buffers,
    attention over the whole head cache under a device-built mask) against the head's own step,
    run eagerly here so CI checks the logic without a GPU: same predicted features, same logits,
    same cache entries, over several steps of a round."""
    from specdec.drafters.eagle_graph import EagleStepGraph
    from specdec.models.head_files import load_head

    head = load_head(head_dir, tiny_target.config).eval()
    decoder = tiny_target.backend.decoder
    scorer = decoder.head_rows(300)
    features = torch.randn(6, head.config.hidden_size, generator=torch.Generator().manual_seed(3))
    tokens = [5, 17, 99, 3, 250, 42]
    eager_cache, static_cache = head.new_cache(16), head.new_cache(16)
    embeds = decoder.model.embed_tokens(torch.tensor(tokens[:4]))
    for cache in (eager_cache, static_cache):  # a round's first pass over committed positions: eager in both
        predicted = head(features[:4], embeds, torch.arange(10, 14), cache)[-1:]
    graph = EagleStepGraph(head, decoder, scorer, static_cache)
    eager_predicted = static_predicted = predicted
    for position, token in zip(range(14, 16), tokens[4:]):
        eager_predicted = head(eager_predicted, decoder.model.embed_tokens(torch.tensor([token])), torch.tensor([position]),
                               eager_cache)
        eager_logits = scorer(decoder.model.norm(eager_predicted)).float()
        graph.feature.copy_(static_predicted)
        graph.token.fill_(token)
        graph.position.fill_(position)
        graph.slot.fill_(static_cache.reserve(1))
        static_predicted, static_logits = graph._run()
        static_cache.advance(1)
        torch.testing.assert_close(static_predicted, eager_predicted, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(static_logits, eager_logits, rtol=1e-5, atol=1e-5)
    assert static_cache.seq_len == eager_cache.seq_len == 6
    torch.testing.assert_close(static_cache.k[:, :, :6], eager_cache.k[:, :, :6])


def test_medusa_tree_nodes_branch_from_their_levels_distribution():
    """A Medusa tree node at depth d takes its token from block d's distribution, whatever its parent:
    its estimate is its parent's × that block's probability of the token; siblings below the first
    branch too (the tree is not a chain), and nothing is deeper than the blocks."""
    from specdec.calls import run_now
    from specdec.drafters.medusa import head_tree

    generator = torch.Generator().manual_seed(0)
    levels = [torch.softmax(2 * torch.randn(40, generator=generator), -1) for _ in range(3)]
    draft = run_now(head_tree(levels, 3))
    node_depths = depths(draft.parents)
    for node, (token, parent) in enumerate(zip(draft.tokens, draft.parents)):
        above = 1.0 if parent < 0 else draft.prefix_accept[parent]
        assert draft.prefix_accept[node] == pytest.approx(above * float(levels[node_depths[node] - 1][token]))
    assert max(node_depths) == 3
    first_children = {draft.parents.index(-1)}
    assert any(depth == 2 and draft.parents[node] not in first_children for node, depth in enumerate(node_depths))


@torch.no_grad()
def test_eagle_tree_nodes_score_what_their_path_drafted_as_a_chain_would(tiny_target, tmp_path, monkeypatch):
    """Every tree node's estimate is its parent's × the head's probability of its token after its
    path — computed here the slow way (the head stepped along that path alone). Greedy identity
    cannot catch a tree built from the wrong features; this can."""
    from specdec.api import make_drafter
    from specdec.drafters import model_steps

    monkeypatch.setattr(model_steps, "DRAFT_TREE_MIN_VALUE", 0.0)  # the tiny model's flat distributions still branch
    head_path = save_head(random_head(tiny_target, draft_vocab_size=300, scale=1.0, seed=3), tmp_path / "sharp")
    ids = tiny_target.tokenizer.encode(PROMPTS[1])
    spec = SpecConfig(method="eagle", drafter_path=str(head_path), num_speculative_tokens=4, spec_tree=16,
                      draft_context_window=4)  # the head reads the last 4 prompt positions: its slot 0 is not position 0
    drafter = make_drafter(tiny_target, spec, GREEDY, torch.Generator().manual_seed(0), len(ids) + 40)
    state = tiny_target.backend.new_state(len(ids) + 40)
    drafter.bind_target_state(state)
    drafter.start(ids)
    tiny_target.backend.forward(state, ids[:-1])  # the prefill: every committed position's feature
    tree = drafter.propose(ids, 4)
    assert tree.parents is not None and max(depths(tree.parents)) >= 2, tree  # branches beyond the first level

    head, committed, first = drafter.head, len(ids) - 1, len(ids) - 4
    assert first > 0
    checked = 0
    for node, parent in enumerate(tree.parents):
        path, at = [], parent
        while at >= 0:
            path.insert(0, tree.tokens[at])
            at = tree.parents[at]
        cache = head.new_cache(64)
        predicted = head(state.features[first:committed].float(), drafter._embed(ids[first + 1 :]),
                         torch.arange(first, committed), cache)[-1:]
        for offset, token in enumerate(path):
            predicted = head(predicted, drafter._embed([token]), torch.tensor([committed + offset]), cache)
        prob = float(torch.softmax(drafter._scores(predicted), -1)[tree.tokens[node]])
        expected = prob * (1.0 if parent < 0 else tree.prefix_accept[parent])
        assert tree.prefix_accept[node] == pytest.approx(expected, rel=1e-4, abs=1e-7), (node, path)
        checked += parent >= 0
    assert checked >= 6, tree


@pytest.mark.parametrize("method", ["eagle"])
def test_a_trained_head_is_accepted_and_still_exact(tiny_target, tmp_path, method):
    """Self-distillation in miniature: train on the target's own greedy continuations of a few
    prompts, then speculate on one of them: the head must earn acceptance, the output stay exact."""
    prompts = [[11 + i, 200 + 7 * i, 40 + 3 * i, 90] for i in range(8)]
    sequences = [p + specdec.generate(tiny_target, p, GREEDY).token_ids for p in prompts]
    data = features_of(tiny_target, sequences)
    head = random_head(tiny_target, kind=method, scale=0.2 if method == "eagle" else 0.0)
    parts = TargetParts(tiny_target.backend.decoder, tiny_target.config.vocab_size)
    train_head(head, parts, data, data, tmp_path,
               TrainConfig(max_steps=200, lr=1e-2, eval_every=100, budget_minutes=5, noise=0.0), progress=False)
    spec = SpecConfig(method=method, drafter_path=str(tmp_path), num_speculative_tokens=3)
    prompt = prompts[0]
    plain = specdec.generate(tiny_target, prompt, GREEDY)
    out = specdec.generate(tiny_target, prompt, GREEDY, spec=spec)
    assert out.token_ids == plain.token_ids
    assert out.stats.acceptance_rate > 0.15, out.stats.summary_line()  # 0.27 here; an untrained head: ~0.02


def sampled_eagle_draft(target, head_path: Path, prompt: str, k: int = 4):
    """``k`` tokens an EAGLE head drafts, sampling at T=1, after ``prompt``'s prefill (and its drafter)."""
    from specdec.api import make_drafter
    from specdec.sampling import make_generator

    params = SamplingParams(temperature=1.0, max_tokens=8, seed=0)
    drafter = make_drafter(target, SpecConfig(method="eagle", num_speculative_tokens=4, drafter_path=str(head_path)), params, make_generator(0), 64)
    ids = target.tokenizer.encode(prompt)
    state = target.backend.new_state(64)
    drafter.bind_target_state(state)
    target.backend.forward(state, ids[:-1])
    drafter.start(ids[:-1])
    return drafter.propose(ids, k), drafter


def test_sampled_drafts_carry_q_over_the_whole_vocabulary(tiny_target, head_dir):
    draft, _ = sampled_eagle_draft(tiny_target, head_dir, PROMPTS[0])
    assert len(draft) == 4 and all(t < 300 for t in draft.tokens)
    assert draft.probs.shape == (4, tiny_target.config.vocab_size)
    assert float(draft.probs[:, 300:].sum()) == 0.0  # q is exactly zero outside its vocabulary


# --- errors -------------------------------------------------------------------------------------------

def test_clear_errors(tiny_target, head_dir, tmp_path):
    with pytest.raises(SpecdecError, match="--drafter-path"):
        specdec.generate(tiny_target, "x", GREEDY, spec=SpecConfig(method="eagle"))
    with pytest.raises(WeightsError, match="not a directory"):
        specdec.generate(tiny_target, "x", GREEDY, spec=SpecConfig(method="eagle", drafter_path=str(tmp_path / "nope")))
    # a head trained for another model (another hidden size) is refused by name
    other = json.loads((head_dir / "config.json").read_text())
    other["target"]["hidden_size"] = 4096
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "config.json").write_text(json.dumps(other))
    (wrong / "model.safetensors").write_bytes((head_dir / "model.safetensors").read_bytes())
    with pytest.raises(SpecdecError, match="another target model"):
        load_head(wrong, tiny_target.config)
    with pytest.raises(SpecdecError, match="holds an eagle head"):
        specdec.generate(tiny_target, "x", GREEDY, spec=SpecConfig(method="medusa", drafter_path=str(head_dir)))
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text((head_dir / "config.json").read_text())
    (corrupt / "model.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(WeightsError, match="safetensors"):
        load_head(corrupt, tiny_target.config)


def test_cli_generate_with_eagle(tiny_dirs, head_dir, capsys):
    code = main(["generate", "--model", str(tiny_dirs["target"]), "--method", "eagle", "--drafter-path", str(head_dir),
                 "def f(x):", "--max-tokens", "12", "--temperature", "0", "--dtype", "float32",
                 "--quantize", "none", "--num-speculative-tokens", "3"])
    assert code == 0
    assert "method=eagle" in capsys.readouterr().err
    assert main(["generate", "--model", str(tiny_dirs["target"]), "--method", "eagle", "x",
                 "--max-tokens", "4", "--quantize", "none"]) == 1


# --- training -----------------------------------------------------------------------------------------

def test_float_head_rows_read_back_any_head(tiny_target, int8_target):
    rows = float_head_rows(tiny_target.backend.decoder, 100)
    assert torch.equal(rows, tiny_target.backend.decoder.lm_head.weight[:100])
    head = int8_target.backend.decoder.lm_head  # Int8Linear: int8 weights × per-row scales
    dequantized = head.qweight[:100].float() * head.scales[:100, None]
    assert torch.allclose(float_head_rows(int8_target.backend.decoder, 100), dequantized, rtol=1e-5, atol=1e-7)


def test_medusa_training_lowers_the_loss(tiny_target, tmp_path):
    """(The tiny model's 64-wide blocks cannot memorize arbitrary maps the way EAGLE's layer can, so
    acceptance is tested on EAGLE; here the loss and the first head's agreement must improve.)"""
    data = periodic_data(tiny_target, 16)
    parts = TargetParts(tiny_target.backend.decoder, tiny_target.config.vocab_size)
    head = random_head(tiny_target, kind="medusa", scale=0.0)
    config = TrainConfig(max_steps=60, lr=1e-2, eval_every=30, budget_minutes=5)
    before = evaluate(head, parts, data, config)
    train_head(head, parts, data, data, tmp_path, config, progress=False)
    after = evaluate(head, parts, data, config)
    assert after["loss"] < 0.95 * before["loss"] and after["top1"] > before["top1"]


def test_training_lowers_the_loss_and_resumes(tiny_target, tmp_path):
    data, held_out = periodic_data(tiny_target, 16), periodic_data(tiny_target, 4, seed=1)
    parts = TargetParts(tiny_target.backend.decoder, tiny_target.config.vocab_size)
    head = random_head(tiny_target)
    config = TrainConfig(max_steps=60, lr=3e-3, eval_every=30, budget_minutes=5)
    before = evaluate(head, parts, data, config)
    history = train_head(head, parts, data, held_out, tmp_path, config, progress=False)
    after = evaluate(head, parts, data, config)
    assert after["loss"] < 0.9 * before["loss"] and after["top1"] > before["top1"]
    assert history.steps[-1] == 60 and (tmp_path / "checkpoint.pt").is_file()
    assert load_head(tmp_path, tiny_target.config).config.training["steps"] == 60
    # resuming continues from the checkpoint's step and history, not from scratch
    more = TrainConfig(max_steps=70, lr=3e-3, eval_every=30, budget_minutes=5)
    resumed = train_head(random_head(tiny_target, seed=5), parts, data, held_out, tmp_path, more, resume=True, progress=False)
    assert resumed.steps[0] == 1 and resumed.steps[-1] == 70 and len(resumed.loss) == 70


@torch.no_grad()
def test_unrolled_training_steps_compute_what_drafting_computes(tiny_target):
    """Row p of unrolled step s (training) must equal the head's (s+1)-th draft step of a round
    whose last real feature is at p−s (inference: cache, then its own predictions one by one)."""
    data = periodic_data(tiny_target, 1, length=24)
    parts = TargetParts(tiny_target.backend.decoder, tiny_target.config.vocab_size)
    head = random_head(tiny_target, scale=0.3).eval()
    features, embeds = data["features"][0, :-1].float(), parts.embed(data["tokens"][0, 1:])
    steps = head.unroll(features, embeds, 3)
    for step, p in [(0, 5), (1, 5), (2, 5), (1, 1), (2, 2), (2, 20)]:
        last_real = p - step
        cache = head.new_cache(32)
        predicted = head(features[: last_real + 1], embeds[: last_real + 1], torch.arange(last_real + 1), cache)[-1:]
        for position in range(last_real + 1, p + 1):
            predicted = head(predicted, embeds[position : position + 1], torch.tensor([position]), cache)
        torch.testing.assert_close(steps[step][p : p + 1], predicted, rtol=1e-3, atol=1e-4)
    # and a wrong visibility rule (step 1 rows seeing every real feature up to their own position) differs
    wrong = head.new_cache(64)
    head(features, embeds, torch.arange(23), wrong)
    leaked = head(torch.cat([features[:1], steps[0][:-1]]), embeds, torch.arange(23), wrong,
                  torch.ones(23, 46, dtype=torch.bool).tril(diagonal=23) & ~torch.eye(23, 46, dtype=torch.bool))
    assert (leaked[5] - steps[1][5]).abs().max() > 1e-2


def test_unrolled_training_raises_agreement_at_later_draft_steps(tiny_target, tmp_path):
    """Training on its own predictions (3 unrolled steps) must beat teacher forcing alone at the
    second and third draft steps (memorization: the tiny random target has nothing to generalize)."""
    data = held_out = periodic_data(tiny_target, 16)
    parts = TargetParts(tiny_target.backend.decoder, tiny_target.config.vocab_size)
    results = {}
    for unroll in (1, 3):
        head = random_head(tiny_target)
        config = TrainConfig(max_steps=150, lr=1e-2, eval_every=150, budget_minutes=5, unroll_steps=unroll)
        train_head(head, parts, data, held_out, tmp_path / str(unroll), config, progress=False)
        results[unroll] = evaluate(head, parts, held_out, config, steps=3)["top1_steps"]
    # measured: teacher forcing [0.38, 0.14, 0.08], unrolled [0.34, 0.27, 0.19]
    assert results[3][1] > results[1][1] + 0.05 and results[3][2] > results[1][2] + 0.05, results
    assert results[3][0] > results[1][0] - 0.1, results  # the first step keeps most of its agreement


def test_documents_split_stably_and_cut_into_sequences(tiny_target):
    docs = [Document(f"doc{i}.py", "def f(x):\n    return x + 1\n" * 40) for i in range(60)]
    held = [d for d in docs if d.held_out]
    assert 0 < len(held) < len(docs) // 4
    train = token_sequences(docs, tiny_target.tokenizer.encode, 64, held_out=False)
    assert train and all(32 <= len(s) <= 64 for s in train)
    assert token_sequences(docs, tiny_target.tokenizer.encode, 64, held_out=False) == train  # seeded order


def test_train_drafter_medusa(tiny_dirs, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"def g{i}(y):\n" + "    y = y + 1\n" * 30}) + "\n" for i in range(40)))
    out = tmp_path / "medusa"
    assert main(["train-drafter", "--kind", "medusa", "--num-heads", "3", "--model", str(tiny_dirs["target"]),
                 "--data", str(corpus), "--out", str(out), "--quantize", "none", "--seq-len", "64", "--max-steps", "8",
                 "--held-out-sequences", "2", "--eval-prompts", "2", "--eval-tokens", "12", "--loss-rows", "32"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["num_medusa_heads"] == 3 and config["training"]["config"]["loss_rows"] == 32
    assert "γ=3" in (out / "report.md").read_text()


def test_train_drafter_command_end_to_end(tiny_dirs, tmp_path, capsys):
    corpus = module_corpus(tmp_path, 40)
    out = tmp_path / "head"
    args = ["train-drafter", "--model", str(tiny_dirs["target"]), "--data", str(corpus), "--out", str(out),
            "--quantize", "none", "--seq-len", "64", "--max-sequences", "24", "--max-steps", "12",
            "--held-out-sequences", "4", "--eval-prompts", "2", "--eval-tokens", "16", "--draft-vocab-size", "300",
            "--checkpoint-minutes", "0"]
    assert main(args) == 0
    draft_ids = load_head(out).draft_ids  # the 300 ids most frequent in the data (the default)
    assert json.loads((out / "config.json").read_text())["draft_vocab"] == "frequency" and len(draft_ids) == 300
    report = (out / "report.md").read_text()
    assert "held-out prompts" in report and "identical to plain: yes" in report
    assert (out / "loss.png").stat().st_size > 1000 and (out / "features" / "train" / "shard-00000.safetensors").is_file()
    assert main(args) == 1  # the run exists: --resume or another --out
    assert "--resume" in capsys.readouterr().err
    assert main([*args[:-2], "--max-steps", "14", "--resume", "--draft-vocab", "first"]) == 0
    assert json.loads((out / "config.json").read_text())["training"]["steps"] == 14
    assert torch.equal(load_head(out).draft_ids, draft_ids)  # a resumed run keeps the vocabulary it trained with
    assert main(["generate", "--model", str(tiny_dirs["target"]), "--method", "eagle", "--drafter-path", str(out),
                 "def f(x):", "--max-tokens", "8", "--temperature", "0", "--quantize", "none"]) == 0


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_head_init_target_starts_the_layer_as_the_targets_last(tiny_dirs, quantize):
    """--head-init target: the EAGLE layer computes what the target's last layer computes on the
    same input (attention as is; a head as wide as the target's MLP keeps every neuron), and a
    narrower head keeps the neurons with the largest up·down norms."""
    from specdec.models.transformer import rope_tables
    from specdec.train.target_parts import float_linear, last_layer_weights

    model = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize=quantize)
    decoder = model.backend.decoder
    cfg = model.config
    full = EagleHead(HeadConfig.for_target(cfg, intermediate_size=cfg.intermediate_size)).init_residual()
    full.init_from_layer(last_layer_weights(decoder, cfg.intermediate_size))
    reference = EagleHead(HeadConfig.for_target(cfg, intermediate_size=cfg.intermediate_size))
    layer = decoder.model.layers[-1]
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        weight, bias = float_linear(getattr(layer.self_attn, name))
        getattr(reference.layer.self_attn, name).weight.data.copy_(weight)
        if bias is not None:
            getattr(reference.layer.self_attn, name).bias.data.copy_(bias)
    for name in ("gate_proj", "up_proj", "down_proj"):
        getattr(reference.layer.mlp, name).weight.data.copy_(float_linear(getattr(layer.mlp, name))[0])
    reference.layer.input_layernorm.weight.data.copy_(layer.input_layernorm.weight.float())
    reference.layer.post_attention_layernorm.weight.data.copy_(layer.post_attention_layernorm.weight.float())
    x = torch.randn(5, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_tables(cfg.head_dim, 16, cfg.rope_theta)
    outputs = [head.layer(x, cos[:5], sin[:5], head.new_cache(16), 0, None) for head in (full, reference)]
    assert torch.allclose(*outputs, atol=1e-5)
    if quantize == "int8":  # dequantized: close to the float layer's weights
        float_q = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="none")
        exact = float_q.backend.decoder.model.layers[-1].self_attn.q_proj.weight
        assert torch.allclose(full.layer.self_attn.q_proj.weight, exact, atol=exact.abs().max().item() / 100)

    narrow = cfg.intermediate_size // 2
    weights = last_layer_weights(decoder, narrow)
    up, down = float_linear(layer.mlp.up_proj)[0], float_linear(layer.mlp.down_proj)[0]
    kept = {tuple(row.tolist()) for row in weights["mlp.up_proj.weight"]}
    best = torch.topk(up.norm(dim=1) * down.norm(dim=0), narrow).indices
    assert kept == {tuple(up[i].tolist()) for i in best.tolist()}
    head = EagleHead(HeadConfig.for_target(cfg, intermediate_size=narrow)).init_residual().init_from_layer(weights)
    assert torch.equal(head.layer.mlp.down_proj.weight, weights["mlp.down_proj.weight"])


def test_train_drafter_head_init_target(tiny_dirs, tmp_path):
    corpus = module_corpus(tmp_path, 20)
    out = tmp_path / "head"
    assert main(["train-drafter", "--model", str(tiny_dirs["target"]), "--data", str(corpus), "--out", str(out),
                 "--quantize", "int8", "--seq-len", "64", "--max-sequences", "8", "--max-steps", "3",
                 "--held-out-sequences", "2", "--skip-eval", "--head-init", "target", "--checkpoint-minutes", "0"]) == 0
    assert json.loads((out / "report.json").read_text())["training"]["head_init"] == "target"


def test_a_head_and_a_model_given_for_each_other_say_what_they_are(head_dir, tiny_dirs):
    """A head folder as --draft-model said "unsupported model_type ''"; a distilled draft (a model folder)
    as --drafter-path said "HeadConfig.__init__() got an unexpected keyword argument 'architectures'"."""
    import specdec
    from specdec.errors import WeightsError
    from specdec.models.head_files import read_head_config

    with pytest.raises(WeightsError, match="holds a trained eagle head, not a model: use it with --method eagle"):
        specdec.load_model(str(head_dir), quantize="none")
    with pytest.raises(WeightsError, match="holds a model .*not a trained head: a distilled draft runs as --draft-model"):
        read_head_config(tiny_dirs["draft"])


def test_written_tensors_take_the_umask_mode_not_0600(head_dir, tmp_path):
    """safetensors' writer makes 0600 files: a trained head or a feature shard could not be shared."""
    import os

    from specdec.paths import write_safetensors

    mask = os.umask(0)
    os.umask(mask)
    write_safetensors({"x": torch.zeros(2)}, tmp_path / "x.safetensors")
    for path in (head_dir / "model.safetensors", tmp_path / "x.safetensors"):
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask
    assert not list(tmp_path.glob("*.partial"))
