"""The CUDA path: the same exactness guarantees on a GPU, through the public API and the CLI.

Skipped where torch sees no CUDA device (CI has none); run on a GPU machine with
``pytest tests/test_cuda.py``. Float modes are not batch-invariant (a k-token GEMM may round
differently from a 1-token one), so greedy identity is checked in float32 on tiny models, where a
rounding difference never decides an argmax, and bf16 is checked for running end to end; the
sampling guarantee is checked with the same χ² certificate as on the CPU, on CUDA generators.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import specdec
from specdec.certify import DISTRIBUTION_CONFIGS, distribution_check
from specdec.cli import main
from specdec.config import SpecConfig
from specdec.errors import ContextLengthError, SpecdecError
from specdec.sampling import SamplingParams
from tests.corpus_fixtures import module_corpus

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPTS = ["def fibonacci(n):", "a a a a a a a a a a a a", "The quick brown fox jumps over the lazy dog. The quick"]


@pytest.fixture(scope="module")
def cuda_pair(tiny_dirs):
    return (specdec.load_model(tiny_dirs["target"], dtype="float32", device="cuda"),
            specdec.load_model(tiny_dirs["draft"], dtype="float32", device="cuda"))


def test_models_live_on_the_gpu_and_match_the_cpu(cuda_pair, tiny_target):
    target, _ = cuda_pair
    assert target.backend.device.type == "cuda"
    assert target.backend.decoder.rope_cos.device.type == "cuda"
    ids = target.tokenizer.encode(PROMPTS[0])
    gpu_logits = target.backend.forward(target.backend.new_state(64), ids).cpu()
    cpu_logits = tiny_target.backend.forward(tiny_target.backend.new_state(64), ids)
    torch.testing.assert_close(gpu_logits, cpu_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["draft_model", "ngram", "suffix", "draft_suffix"])
@pytest.mark.parametrize("gamma", [1, 3, "auto"])
def test_greedy_speculative_equals_plain_on_cuda(cuda_pair, method, gamma):
    target, draft = cuda_pair
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    for prompt in PROMPTS:
        plain = specdec.generate(target, prompt, params)
        spec = specdec.generate(target, prompt, params, draft=draft,  # used only by the methods that need it
                                spec=SpecConfig(method=method, num_speculative_tokens=gamma))
        assert spec.token_ids == plain.token_ids, (method, gamma, prompt)
        assert len(spec.token_ids) == 32


def test_same_model_draft_is_fully_accepted_on_cuda(cuda_pair):
    target, _ = cuda_pair
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    out = specdec.generate(target, PROMPTS[0], params, draft=target, spec=SpecConfig(num_speculative_tokens=4))
    assert out.stats.acceptance_rate == 1.0
    assert out.token_ids == specdec.generate(target, PROMPTS[0], params).token_ids


def test_seeded_sampling_is_reproducible_on_cuda(cuda_pair):
    target, draft = cuda_pair
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=24, seed=7, ignore_eos=True)
    first = specdec.generate(target, PROMPTS[1], params, draft=draft)
    again = specdec.generate(target, PROMPTS[1], params, draft=draft)
    assert first.token_ids == again.token_ids
    assert len(first.token_ids) == 24


@pytest.mark.parametrize("config", ["T=1", "T=0.7,top-k=4"])
@pytest.mark.parametrize("method", ["draft_model", "suffix"])
def test_distribution_certificate_passes_on_cuda(method, config):
    result = distribution_check(method, config, DISTRIBUTION_CONFIGS[config], samples=1500, device="cuda")
    assert result.passed, result.detail


def test_bfloat16_runs_end_to_end_on_cuda(tiny_dirs):
    target = specdec.load_model(tiny_dirs["target"], dtype="bfloat16", device="cuda")
    assert target.backend.dtype_name == "bfloat16"
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    out = specdec.generate(target, PROMPTS[0], params, draft=target, spec=SpecConfig(num_speculative_tokens=3))
    assert len(out.token_ids) == 16 and out.stats.acceptance_rate > 0.5


def test_cpu_only_quantization_is_refused_on_cuda(tiny_dirs):
    with pytest.raises(SpecdecError, match="CPU path"):
        specdec.load_model(tiny_dirs["target"], device="cuda", quantize="int8")


def test_cli_generate_on_cuda(tiny_dirs, capsys):
    code = main(["generate", "def f(x):", "--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]),
                 "--device", "cuda", "--dtype", "float32", "--max-tokens", "12", "--compare-plain"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "execution: float32, draft float32 on cuda" in captured.err


def test_cuda_graphs_replay_what_eager_steps_compute(tiny_dirs):
    """Graph replay (the default) against eager steps of the same weights: same greedy tokens and
    logits within float rounding; a second request reuses the pooled cache and the recorded graphs."""
    graphed = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cuda")
    assert graphed.backend.graphs is not None
    eager = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cuda")
    eager.backend.graphs = None
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for method in (None, "suffix"):
        spec = SpecConfig(method=method, num_speculative_tokens=3)
        got = specdec.generate(graphed, PROMPTS[2], params, spec=spec)
        want = specdec.generate(eager, PROMPTS[2], params, spec=spec)
        assert got.token_ids == want.token_ids, method
    recorded = len(graphed.backend.graphs.graphs)
    assert recorded >= 2  # T=1 steps and suffix verification chunks
    specdec.generate(graphed, PROMPTS[2], params, spec=SpecConfig(method="suffix", num_speculative_tokens=3))
    assert len(graphed.backend.graphs.graphs) == recorded  # same storage, same chunk sizes: nothing new
    ids = graphed.tokenizer.encode(PROMPTS[0])
    g_state, e_state = graphed.backend.new_state(64), eager.backend.new_state(64)
    graphed.backend.forward(g_state, ids[:-3])
    eager.backend.forward(e_state, ids[:-3])
    torch.testing.assert_close(graphed.backend.forward(g_state, ids[-3:]), eager.backend.forward(e_state, ids[-3:]),
                               rtol=1e-4, atol=1e-4)
    assert g_state.seq_len == e_state.seq_len == len(ids)


@pytest.mark.parametrize("method", ["draft_model", "suffix", "ngram", "draft_suffix"])
@pytest.mark.parametrize("tree", [3, "auto"])
def test_greedy_tree_speculation_equals_plain_on_cuda(cuda_pair, method, tree):
    """Token trees on the GPU (verification and the draft model's tree levels replay graphs)."""
    target, draft = cuda_pair
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    for prompt in PROMPTS:
        plain = specdec.generate(target, prompt, params)
        spec = specdec.generate(target, prompt, params, draft=draft,
                                spec=SpecConfig(method=method, num_speculative_tokens=3, spec_tree=tree))
        assert spec.token_ids == plain.token_ids, (method, tree, prompt)


def test_cuda_graphs_replay_tree_steps_as_eager_ones(tiny_dirs):
    """A tree forward replayed from a graph (slots and ancestor mask in device buffers) against the
    eager tree forward: same logits within float rounding, same cache; a second tree of the same
    size replays the recorded graph with its own mask."""
    from specdec.tree import TreeLayout

    graphed = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cuda")
    eager = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cuda")
    eager.backend.graphs = None
    ids = graphed.tokenizer.encode(PROMPTS[2])
    g_state, e_state = graphed.backend.new_state(64), eager.backend.new_state(64)
    graphed.backend.forward(g_state, ids[:-1])
    eager.backend.forward(e_state, ids[:-1])
    base = len(ids) - 1
    for parents in ([-1, 0, 0, 1, 1, 2, 3], [-1, 0, 1, 2, 0, 4, 0]):
        tree = TreeLayout(base, parents)
        tokens = [ids[-1], 11, 12, 13, 14, 15, 16]
        got = graphed.backend.forward(g_state, tokens, tree=tree)
        want = eager.backend.forward(e_state, tokens, tree=tree)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(g_state.k[:, :, : g_state.seq_len], e_state.k[:, :, : e_state.seq_len])
        g_state.truncate(base)
        e_state.truncate(base)
    assert sum(1 for key in graphed.backend.graphs.graphs if key[2]) == 1  # one tree graph, replayed


def test_cuda_graph_cache_overflow_is_a_clear_error(tiny_dirs):
    target = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cuda")
    state = target.backend.new_state(4)
    target.backend.forward(state, [1, 2, 3])
    with pytest.raises(ContextLengthError):
        target.backend.forward(state, [4, 5])
    assert state.seq_len == 3


def test_cpu_execution_modes_pick_the_cpu_under_device_auto(tiny_dirs):
    """`make run` passes --quantize int4 and no --device: on a GPU machine it must run, on the CPU."""
    model = specdec.load_model(tiny_dirs["target"], quantize="int4")
    assert model.backend.device.type == "cpu" and model.backend.dtype_name == "int4"
    assert specdec.load_model(tiny_dirs["target"], dtype="float32").backend.device.type == "cuda"


# --- trained drafters and the batch API on the GPU ----------------------------------------------------------

@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_feature_heads_are_exact_on_cuda(cuda_pair, tiny_target, tmp_path, kind):
    """An EAGLE / Medusa head drafts on the GPU (features recorded in the target's CUDA cache, the head
    moved to the target's device); chains and trees give plain decoding's tokens."""
    from specdec.models.head_files import save_head
    from tests.test_heads import random_head

    target, _ = cuda_pair
    path = save_head(random_head(tiny_target, draft_vocab_size=300, kind=kind, scale=0.3 if kind == "medusa" else 0.2),
                     tmp_path / kind)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    for tree in ("off", 4):
        spec = SpecConfig(method=kind, drafter_path=str(path), num_speculative_tokens=3, spec_tree=tree)
        for prompt in PROMPTS:
            out = specdec.generate(target, prompt, params, spec=spec)
            assert out.token_ids == specdec.generate(target, prompt, params).token_ids, (kind, tree, prompt)
            assert out.stats.proposed_tokens > 0
    # the target's steps replayed graphs that write the features (not eager steps), recorded once
    graphs = target.backend.graphs.graphs
    assert any(records_features for (_, _, _, records_features) in graphs)
    recorded = len(graphs)
    specdec.generate(target, PROMPTS[0], params, spec=spec)
    assert len(graphs) == recorded


def test_batch_api_answers_each_prompt_as_alone_on_cuda(cuda_pair):
    """`generate_batch` on a GPU target (float modes run each request's forwards on their own):
    every answer is the one `generate` gives alone, with and without a draft model."""
    target, draft = cuda_pair
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    for spec in (None, SpecConfig(method="draft_model", num_speculative_tokens=3)):
        results = specdec.generate_batch(target, PROMPTS * 2, params, draft=draft if spec else None, spec=spec,
                                         max_num_seqs=4)
        for prompt, result in zip(PROMPTS * 2, results):
            alone = specdec.generate(target, prompt, params, draft=draft if spec else None, spec=spec)
            assert result.token_ids == alone.token_ids, (spec, prompt)


def documented_corpus(tmp_path) -> Path:
    """30 small modules of documented functions: training sequences, and prompts that self-distillation
    (--generate-minutes) continues (it needs functions with docstrings)."""
    return module_corpus(tmp_path, 30, docstring="Scale.")


@pytest.mark.parametrize("kind", ["eagle", "distill"])
def test_train_drafter_trains_on_the_gpu(tiny_dirs, tmp_path, kind):
    """`specdec train-drafter` with CUDA present: the target loads on the GPU and generates the
    self-distillation continuations there (their features recorded by graphed steps), the head (or
    the draft's last layers) trains there in bfloat16 (before, the head stayed on the CPU and the
    first step failed on mixed devices), and the report speculates with the result."""
    corpus = documented_corpus(tmp_path)
    out = tmp_path / kind
    args = ["train-drafter", "--kind", kind, "--model", str(tiny_dirs["target"]), "--data", str(corpus), "--out", str(out),
            "--seq-len", "64", "--max-sequences", "16", "--max-steps", "10", "--held-out-sequences", "4",
            "--eval-prompts", "2", "--eval-tokens", "12", "--generate-minutes", "0.2", "--generate-tokens", "8"]
    if kind == "distill":
        args += ["--draft-model", str(tiny_dirs["draft"]), "--trainable-layers", "1"]
    assert main(args) == 0
    training = json.loads((out / ("distill.json" if kind == "distill" else "config.json")).read_text())
    training = training if kind == "distill" else training["training"]
    assert training["precision"] == "bfloat16" and training["steps"] == 10
    assert training["generated_continuations"] > 0 and (out / "features" / "generated" / "shard-00000.safetensors").is_file()
    assert "identical to plain:" in (out / "report.md").read_text()  # bf16 verification is not batch-invariant


def test_continuations_record_the_teacher_forced_features_on_the_gpu(tiny_dirs):
    """Self-distillation data on CUDA (specdec.train.generated.continue_greedily): the continuations'
    steps replay CUDA graphs that write each row's features into the pooled cache's buffer; what they
    record — features and greedy tokens — is what teacher forcing over the same tokens computes, and
    the continuations are greedy decoding's."""
    from specdec.train.data import teacher_forced
    from specdec.train.generated import continue_greedily

    target = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cuda")
    prompts = [target.tokenizer.encode(p) for p in PROMPTS]
    made = list(continue_greedily(target.backend, prompts, 12, 2, frozenset(), 64))
    assert sorted(c.index for c in made) == [0, 1, 2]
    assert any(records for (_, _, _, records) in target.backend.graphs.graphs)  # graphs that write features ran
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for c in made:
        assert c.tokens[len(prompts[c.index]):] == specdec.generate(target, prompts[c.index], params).token_ids
        features, greedy = teacher_forced(target.backend, c.tokens[:-1])
        assert c.features.device.type == "cpu" and c.features.shape == features.shape
        assert torch.allclose(c.features, features.cpu(), atol=1e-3, rtol=1e-3)
        assert c.target_ids.tolist() == greedy.cpu().tolist()


def test_eagle_chain_steps_replay_a_graph_as_eager_steps_on_cuda(tiny_dirs, tiny_target, tmp_path, monkeypatch):
    """EAGLE's chain draft steps replay a CUDA graph of their own where the target replays graphs
    (eagle_graph.py): the same drafts, acceptance and output as eager head steps."""
    from specdec.drafters.eagle_graph import EagleStepGraph
    from specdec.models.head_files import save_head
    from tests.test_heads import random_head

    path = save_head(random_head(tiny_target, draft_vocab_size=300), tmp_path / "eagle")
    graphed = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cuda")
    eager = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cuda")
    eager.backend.graphs = None
    steps = []
    original = EagleStepGraph.step
    monkeypatch.setattr(EagleStepGraph, "step", lambda self, *args: steps.append(1) or original(self, *args))
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    spec = SpecConfig(method="eagle", drafter_path=str(path), num_speculative_tokens=4)
    for prompt in PROMPTS:
        got = specdec.generate(graphed, prompt, params, spec=spec)
        want = specdec.generate(eager, prompt, params, spec=spec)
        assert got.token_ids == want.token_ids == specdec.generate(eager, prompt, params).token_ids
        assert (got.stats.proposed_tokens, got.stats.accepted_tokens) == (want.stats.proposed_tokens,
                                                                          want.stats.accepted_tokens)
    assert steps  # the graphed run's chain steps went through the graph (the eager target's did not)


# --- EAGLE-3's fused features on the GPU ------------------------------------------------------------------

def test_a_fused_feature_head_is_exact_on_cuda(cuda_pair, tiny_target, tmp_path):
    """A head over layers 1, 2 and 4 (the decoder runs its layers in pieces to record them): the
    target's graphed steps record all three slices, chains and trees give plain decoding's tokens, and
    graphed and eager targets draft the same chains (the slices a graph writes are the eager ones)."""
    from specdec.models.head_files import save_head
    from tests.test_feature_layers import fused_head

    target, _ = cuda_pair
    path = save_head(fused_head(tiny_target, scale=0.3), tmp_path / "fused")
    eager = specdec.load_model(target.path, dtype="float32", device="cuda")
    eager.backend.graphs = None
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    for tree in ("off", 4):
        spec = SpecConfig(method="eagle", drafter_path=str(path), num_speculative_tokens=3, spec_tree=tree)
        for prompt in PROMPTS:
            got = specdec.generate(target, prompt, params, spec=spec)
            want = specdec.generate(eager, prompt, params, spec=spec)
            assert got.token_ids == want.token_ids == specdec.generate(target, prompt, params).token_ids, (tree, prompt)
            assert got.stats.proposed_tokens > 0
            if tree == "off":  # a tree's size follows the measured verify costs (timings): only chains compare
                assert (got.stats.proposed_tokens, got.stats.accepted_tokens) == (want.stats.proposed_tokens,
                                                                                  want.stats.accepted_tokens)
    assert any(records_features for (_, _, _, records_features) in target.backend.graphs.graphs)


def test_train_drafter_fused_features_on_the_gpu(tiny_dirs, tmp_path):
    """`train-drafter --feature-layers 1,2,4` with CUDA present: extraction records the three slices on
    the GPU, the fused head trains in bfloat16 there and its report speculates with it."""
    corpus = documented_corpus(tmp_path)
    out = tmp_path / "fused"
    assert main(["train-drafter", "--model", str(tiny_dirs["target"]), "--data", str(corpus), "--out", str(out),
                 "--seq-len", "64", "--max-sequences", "8", "--max-steps", "6", "--held-out-sequences", "2",
                 "--eval-prompts", "2", "--eval-tokens", "8", "--draft-vocab-size", "300", "--feature-layers", "1,2,4",
                 "--generate-minutes", "0.2", "--generate-tokens", "8"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["feature_layers"] == [1, 2, 4] and config["training"]["precision"] == "bfloat16"
    assert "identical to plain:" in (out / "report.md").read_text()
