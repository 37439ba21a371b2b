"""Features from several of the target's layers (EAGLE-3's fused low/middle/final features).

The target's cache records the residual stream entering chosen layers (``KVCache.record_features``);
the decoder runs its layers in pieces to write them. What must hold: the logits do not change by a
bit (greedy output with such a drafter is plain decoding's), each recorded slice is what running
that many layers gives, batched requests recording different layers get what they get alone, and
a head that fuses several layers trains, drafts exactly, and refuses layers it cannot read.
"""

from __future__ import annotations

import json

import pytest
import torch

import specdec
from specdec.cli import main
from specdec.config import SpecConfig
from specdec.errors import SpecdecError, WeightsError
from specdec.kernels.int8 import int8_available
from specdec.models.head_files import load_head, save_head
from specdec.models.heads import EagleHead, HeadConfig, fused_layers
from specdec.models.transformer import layer_pieces
from specdec.sampling import SamplingParams
from specdec.train.data import select_layers, teacher_forced
from specdec.train.loop import TrainConfig, evaluate, train_head
from specdec.train.target_parts import TargetParts
from tests.corpus_fixtures import module_corpus

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
LAYERS = (1, 2, 4)  # the tiny target has 4 layers: a low, a middle and the final hidden state
MODES = ["none", "int8", "int4"]


def test_layer_pieces_cut_before_each_kept_layer():
    assert layer_pieces(range(4), ()) == [([0, 1, 2, 3], None)]
    assert layer_pieces(range(4), (1, 2, 4)) == [([0], 1), ([1], 2), ([2, 3], 4), ([], None)]
    # a subset of the layers (layer skipping) keeps what entering each stop would have seen
    assert layer_pieces([0, 3], (2, 4)) == [([0], 2), ([3], 4), ([], None)]


@pytest.mark.parametrize("quantize", MODES)
def test_recording_layers_changes_no_logit_and_each_slice_is_that_many_layers(tiny_dirs, quantize):
    if quantize == "int8" and not int8_available():
        pytest.skip("no int8 kernel on this CPU")
    model = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize=quantize)
    backend, hidden = model.backend, model.config.hidden_size
    ids = list(range(7, 30))
    plain = backend.forward(backend.new_state(32), ids)
    assert torch.equal(backend.forward(_recording(backend, hidden, LAYERS), ids), plain)
    for part, layer in enumerate(LAYERS):
        alone = backend.new_state(32)
        alone.record_features(hidden)  # the final layer's, of a forward through the first ``layer`` layers
        backend.decoder.forward(torch.tensor(ids), torch.arange(len(ids)), alone, layers=range(layer))
        recorded = _recording(backend, hidden, LAYERS)
        backend.forward(recorded, ids)
        assert torch.equal(recorded.features[: len(ids), part * hidden : (part + 1) * hidden], alone.features[: len(ids)])


def _recording(backend, hidden: int, layers: tuple[int, ...]):  # noqa: ANN001, ANN202 - TorchBackend, KVCache
    state = backend.new_state(32)
    state.record_features(hidden, layers)
    return state


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_batched_requests_recording_different_layers_get_what_they_get_alone(tiny_dirs, quantize):
    if quantize == "int8" and not int8_available():
        pytest.skip("no int8 kernel on this CPU")
    model = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize=quantize)
    backend, hidden = model.backend, model.config.hidden_size
    recorded = [LAYERS, (), (2, 4)]  # a fused head's request, a draft model's, another head's
    chunks = [list(range(3, 12)), [40], list(range(60, 64))]

    def states():  # noqa: ANN202
        made = [backend.new_state(32) for _ in recorded]
        for state, layers in zip(made, recorded):
            if layers:
                state.record_features(hidden, layers)
        return made

    together, alone = states(), states()
    batched = backend.forward_batch([(state, chunk, None, None) for state, chunk in zip(together, chunks)])
    for state, other, chunk, logits in zip(together, alone, chunks, batched):
        assert torch.equal(logits, backend.forward(other, chunk))
        if state.features is not None:
            assert torch.equal(state.features[: len(chunk)], other.features[: len(chunk)])


def test_a_cache_refuses_layers_it_cannot_record(tiny_target):
    state = tiny_target.backend.new_state(8)
    with pytest.raises(ValueError, match="ascend"):
        state.record_features(8, (4, 2))
    with pytest.raises(ValueError, match="ascend"):
        state.record_features(8, (0, 4))
    state.record_features(tiny_target.config.hidden_size, LAYERS)
    state.record_features(tiny_target.config.hidden_size, LAYERS)  # asking again is fine
    with pytest.raises(ValueError, match="records the features of layers"):
        state.record_features(tiny_target.config.hidden_size)


def fused_head(target, seed: int = 0, scale: float = 0.2) -> EagleHead:
    torch.manual_seed(seed)
    config = HeadConfig.for_target(target.config, draft_vocab_size=300, feature_layers=LAYERS)
    return EagleHead(config).init_residual(scale)


def test_fused_layers_and_their_errors(tiny_target):
    assert fused_layers(28) == (2, 14, 28) and fused_layers(4) == (2, 4) and fused_layers(1) == (1,)
    cfg = tiny_target.config
    head = fused_head(tiny_target)
    assert head.fuse is not None and head.fuse.in_features == 3 * cfg.hidden_size
    # it starts as a final-feature head: fuse passes the final layer's feature through
    features = torch.randn(5, 3 * cfg.hidden_size)
    assert torch.equal(head.target_feature(features), features[:, -cfg.hidden_size :])
    assert EagleHead(HeadConfig.for_target(cfg)).fuse is None
    for wrong in [(1, 2), (2, 1, 4), (0, 4), (2, 5)]:
        with pytest.raises(SpecdecError, match="must ascend"):
            HeadConfig.for_target(cfg, feature_layers=wrong)
    with pytest.raises(SpecdecError, match="medusa heads read the final layer"):
        HeadConfig.for_target(cfg, kind="medusa", feature_layers=LAYERS)


def test_a_fused_head_saves_loads_and_an_older_config_reads_the_final_layer(tiny_target, tmp_path):
    path = save_head(fused_head(tiny_target), tmp_path / "fused")
    assert json.loads((path / "config.json").read_text())["feature_layers"] == list(LAYERS)
    assert load_head(path, tiny_target.config).config.read_layers == LAYERS
    old = save_head(EagleHead(HeadConfig.for_target(tiny_target.config)), tmp_path / "old")
    config = json.loads((old / "config.json").read_text())
    del config["feature_layers"]  # a head written before the field
    (old / "config.json").write_text(json.dumps(config))
    assert load_head(old, tiny_target.config).config.read_layers == (tiny_target.config.num_layers,)
    config["feature_layers"] = [3, 1]
    (old / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="must ascend"):
        load_head(old, tiny_target.config)


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_a_fused_head_drafts_exactly(tiny_dirs, tmp_path, quantize):
    target = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize=quantize)
    path = save_head(fused_head(target, scale=0.3), tmp_path / "fused")
    for tree in ("off", 6):
        spec = SpecConfig(method="eagle", drafter_path=str(path), num_speculative_tokens=3, spec_tree=tree)
        for prompt in ["def fibonacci(n):", "The quick brown fox jumps over the lazy dog. The quick"]:
            plain = specdec.generate(target, prompt, GREEDY)
            out = specdec.generate(target, prompt, GREEDY, spec=spec)
            assert out.token_ids == plain.token_ids
            assert out.stats.proposed_tokens > 0


def test_a_fused_head_trains_on_fused_data_and_a_final_head_on_its_last_slice(tiny_target, tmp_path):
    """One recording at several layers trains heads of any subset (select_layers); the fused head
    learns (loss falls) and its training sees the same final-layer targets as a final-layer head."""
    prompts = [[11 + i, 200 + 7 * i, 40 + 3 * i, 90] for i in range(6)]
    sequences = [p + specdec.generate(tiny_target, p, GREEDY).token_ids for p in prompts]
    rows = [teacher_forced(tiny_target.backend, seq, LAYERS) for seq in sequences]
    shard = {"tokens": torch.tensor(sequences, dtype=torch.int32), "features": torch.stack([f.half() for f, _ in rows]),
             "target_ids": torch.stack([g.to(torch.int32) for _, g in rows]),
             "feature_layers": torch.tensor(LAYERS, dtype=torch.int32)}
    hidden, depth = tiny_target.config.hidden_size, tiny_target.config.num_layers
    final = select_layers(shard, depth, (depth,))
    assert torch.equal(final["features"], shard["features"][..., -hidden:])
    assert torch.equal(final["features"][0].float(), teacher_forced(tiny_target.backend, sequences[0])[0].half().float())
    with pytest.raises(SpecdecError, match="not \\[3\\]"):
        select_layers(final, depth, (3, depth))
    data = {name: shard[name] for name in ("tokens", "features", "target_ids")}
    parts = TargetParts(tiny_target.backend.decoder, 300)
    head = fused_head(tiny_target)
    config = TrainConfig(max_steps=60, lr=1e-2, eval_every=60, budget_minutes=5, noise=0.05)
    before = evaluate(head, parts, data, config)["loss"]
    train_head(head, parts, data, data, tmp_path / "head", config, progress=False)
    assert evaluate(head, parts, data, config)["loss"] < before - 0.5
    assert load_head(tmp_path / "head").fuse is not None


def test_train_drafter_fused_features_end_to_end(tiny_dirs, tmp_path):
    corpus = module_corpus(tmp_path, 30)
    out = tmp_path / "head"
    common = ["train-drafter", "--model", str(tiny_dirs["target"]), "--data", str(corpus), "--quantize", "none",
              "--seq-len", "64", "--max-sequences", "8", "--max-steps", "4", "--held-out-sequences", "2",
              "--eval-prompts", "2", "--eval-tokens", "8", "--draft-vocab-size", "300"]
    assert main([*common, "--out", str(out), "--feature-layers", "1,2,4", "--reg-weight", "0"]) == 0  # EAGLE-3's losses
    config = json.loads((out / "config.json").read_text())
    assert config["feature_layers"] == [1, 2, 4] and config["training"]["config"]["reg_weight"] == 0
    assert "identical to plain: yes" in (out / "report.md").read_text()
    # the same data trains a final-layer head (its last slice); a layer it lacks is a clear error
    again = tmp_path / "final"
    again.mkdir()
    (again / "features").symlink_to(out / "features")
    assert main([*common, "--out", str(again), "--extract-minutes", "0"]) == 0
    assert json.loads((again / "config.json").read_text())["feature_layers"] == [4]
    assert main([*common, "--out", str(tmp_path / "bad"), "--feature-layers", "4,2"]) == 1
    with pytest.raises(SystemExit):  # not layer numbers at all: refused before the target loads
        main([*common, "--out", str(tmp_path / "bad"), "--feature-layers", "2,x"])


def test_one_parser_reads_the_feature_layers_form_for_the_cli_and_the_library():
    """``--feature-layers``' form has one rule (train.feature_spec): the CLI refuses a typo before the
    target loads, and a library caller of the training job gets the same message."""
    import argparse

    from specdec.cli.train_drafter import feature_layers_arg
    from specdec.train.feature_spec import parse_feature_layers
    from specdec.train.pipeline import feature_layers

    assert parse_feature_layers("final") == "final" and parse_feature_layers("2,14,28") == (2, 14, 28)
    with pytest.raises(SpecdecError, match="give final, fused or ascending layer numbers") as library:
        feature_layers("2,x", 28, "eagle")
    with pytest.raises(argparse.ArgumentTypeError) as cli:
        feature_layers_arg("2,x")
    assert str(cli.value) == str(library.value)
    assert feature_layers("fused", 28, "eagle") == (2, 14, 28) and feature_layers("2,14", 28, "distill") == (28,)
