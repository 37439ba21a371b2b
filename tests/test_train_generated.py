"""Self-distillation data (specdec.train.generated): prompts drawn from code, the target's own
continuations, resumable, and train-drafter using them."""

from __future__ import annotations

import json

import pytest
import torch

import specdec
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.train.data import Document, file_documents, load_shards, teacher_forced
from specdec.train.generated import (BATCH_PROMPTS, function_prompts, generate_sequences, generated_sequences,
                                     held_out_continuations, held_out_prompts, read_generated)
from tests.corpus_fixtures import module_corpus

SOURCE = '''import os
from typing import List


def documented(values: List[int]) -> int:
    """Sum the values."""
    total = 0
    for v in values:
        total += v
    return total


def bare(x):
    return x


class Box:
    @staticmethod
    def method(y):
        """Twice y."""
        return 2 * y

    def only_doc(self):
        """Nothing else."""
'''


def test_function_prompts_are_imports_signature_and_docstring_without_the_body():
    prompts = {p.name.split(":")[-1]: p.text for p in function_prompts(Document("m.py", SOURCE))}
    assert set(prompts) == {"documented", "method"}  # no docstring, or nothing but one: no prompt
    assert prompts["documented"] == ('import os\nfrom typing import List\n\n\n'
                                     'def documented(values: List[int]) -> int:\n    """Sum the values."""\n')
    assert prompts["method"].endswith('@staticmethod\ndef method(y):\n    """Twice y."""\n')  # dedented, decorated
    assert function_prompts(Document("broken.py", "def f(:\n")) == []


def corpus(tmp_path, files: int = 40):
    return module_corpus(tmp_path, files, functions=3, docstring="Scale x by {j}.")


def test_continuations_are_the_targets_own_and_a_resumed_run_adds_only_new_prompts(tiny_target, tmp_path):
    docs = file_documents(corpus(tmp_path, 12))
    path, shards = tmp_path / "generated.jsonl", tmp_path / "features"

    def generate(minutes: float = 10, **kwargs) -> list[dict]:
        return generate_sequences(tiny_target, docs, path, shards, minutes=minutes, new_tokens=6, **kwargs)

    rows = generate(concurrency=4)
    train_docs = [d for d in docs if not d.held_out]
    assert len(rows) == 3 * len(train_docs) and len({r["name"] for r in rows}) == len(rows)
    assert [r["shard"] for r in rows] == [i // BATCH_PROMPTS for i in range(len(rows))]
    params = specdec.SamplingParams(max_tokens=6, temperature=0.0)
    for row in rows[:3]:  # greedy continuations, the same as generating alone
        prompt = row["tokens"][: row["prompt_tokens"]]
        assert row["tokens"][row["prompt_tokens"]:] == specdec.generate(tiny_target, prompt, params).token_ids
    with path.open("a") as sink:
        sink.write('{"name": "torn')  # a run cut mid-write
    assert generate() == rows  # nothing left to do
    assert read_generated(path) == rows
    last_shard = [r for r in rows if r["shard"] == rows[-1]["shard"]]
    kept = rows[: len(rows) - len(last_shard)]  # as if the run had been cut after its last shard, before its rows
    path.write_text("".join(json.dumps(r) + "\n" for r in kept) + json.dumps(last_shard[0])[:20])
    again = generate()
    assert again[len(kept):] == last_shard  # made again, into the shard the cut run had written (not a second copy)
    assert read_generated(path) == rows
    assert generate(minutes=0) == rows
    depth = tiny_target.config.num_layers
    data = load_shards(shards, num_layers=depth, layers=(depth,))
    assert data["tokens"].shape[0] == len(rows)
    assert generated_sequences(rows, seq_len=8) == []  # their features exist: nothing to extract
    older = [{key: value for key, value in r.items() if key != "shard"} for r in rows]  # rows of a run before features
    sequences = generated_sequences(older, seq_len=8)
    assert len(sequences) == len(rows) and all(len(s) == 8 for s in sequences)
    held = held_out_prompts(docs, tiny_target.tokenizer.encode, 2)
    assert held and all(tiny_target.tokenizer.decode(ids).startswith("def f") for ids in held)


def test_features_recorded_while_generating_are_the_teacher_forced_ones(tiny_target, tmp_path):
    """The rows a shard holds: every fed token (the last generated one is never fed) with the
    target's features at it and its greedy next token — what teacher forcing over the same tokens
    gives (features to float rounding: a decode step computes a row alone, a prefill all at once),
    here at several layers (EAGLE-3's fused features)."""
    docs = file_documents(corpus(tmp_path, 6))
    layers = (1, 2, tiny_target.config.num_layers)
    rows = generate_sequences(tiny_target, docs, tmp_path / "g.jsonl", tmp_path / "features", minutes=10, new_tokens=5,
                              layers=layers, seq_len=12, concurrency=3)
    data = load_shards(tmp_path / "features", num_layers=tiny_target.config.num_layers, layers=layers)
    for index, row in enumerate(rows[:4]):
        fed = row["tokens"][:-1][-12:]
        length = int((data["tokens"][index] >= 0).sum())
        assert data["tokens"][index, :length].tolist() == fed
        features, greedy = teacher_forced(tiny_target.backend, row["tokens"][:-1], layers)
        assert torch.allclose(data["features"][index, :length].float(), features[-12:].float(), atol=2e-2, rtol=1e-2)
        assert data["target_ids"][index, :length].tolist() == greedy[-12:].tolist()
        assert data["target_ids"][index, length - 5 : length].tolist() == row["tokens"][-5:]  # the continuation


def test_held_out_continuations_are_the_targets_greedy_text_and_kept(tiny_target, tmp_path, monkeypatch):
    """The held-out curve's data for a run trained on continuations: held-out prompts continued by
    the target (not the training documents'), one shard, read back (not regenerated) by a resumed run."""
    docs = file_documents(corpus(tmp_path, 40))
    held = held_out_prompts(docs, tiny_target.tokenizer.encode, 3)
    assert held_out_continuations(tiny_target, held, tmp_path / "held", new_tokens=5, seq_len=64, concurrency=2)
    data = load_shards(tmp_path / "held", num_layers=tiny_target.config.num_layers, layers=(tiny_target.config.num_layers,))
    params = specdec.SamplingParams(max_tokens=5, temperature=0.0)  # both stop at a stop token
    assert data["tokens"].shape[0] == len(held) == 3
    for index, prompt in enumerate(held):
        continuation = specdec.generate(tiny_target, prompt, params).token_ids
        length = int((data["tokens"][index] >= 0).sum())
        assert data["tokens"][index, :length].tolist() == (prompt + continuation)[:-1]
        assert data["target_ids"][index, length - len(continuation) : length].tolist() == continuation

    def regenerated(*_args, **_kwargs):
        raise AssertionError("the held-out continuations were generated again")

    monkeypatch.setattr("specdec.train.generated.continue_greedily", regenerated)
    assert held_out_continuations(tiny_target, held, tmp_path / "held", new_tokens=5)
    monkeypatch.undo()
    assert held_out_continuations(tiny_target, held[:2], tmp_path / "held", new_tokens=5)  # another count: replaced
    assert load_shards(tmp_path / "held", num_layers=tiny_target.config.num_layers,
                       layers=(tiny_target.config.num_layers,))["tokens"].shape[0] == 2
    no_prompts = held_out_prompts([Document("a.txt", "short")], tiny_target.tokenizer.encode, 3)
    assert no_prompts == []
    assert not held_out_continuations(tiny_target, no_prompts, tmp_path / "none", new_tokens=5)
    assert not (tmp_path / "none").exists()


def test_data_without_prompts_is_a_clear_error(tiny_target, tmp_path):
    with pytest.raises(SpecdecError, match="no prompts"):
        generate_sequences(tiny_target, [Document("a.txt", "short")], tmp_path / "g.jsonl", tmp_path / "f", minutes=1,
                           new_tokens=4)


def test_train_drafter_with_self_distillation(tiny_dirs, tmp_path):
    out = tmp_path / "head"
    assert main(["train-drafter", "--model", str(tiny_dirs["target"]), "--data", str(corpus(tmp_path)), "--out", str(out),
                 "--quantize", "none", "--seq-len", "64", "--max-steps", "4", "--held-out-sequences", "2",
                 "--eval-prompts", "2", "--eval-tokens", "8", "--generate-minutes", "5", "--generate-tokens", "8"]) == 0
    info = json.loads((out / "report.json").read_text())["training"]
    rows = read_generated(out / "generated.jsonl")
    assert info["generated_continuations"] == len(rows) > 0
    assert info["generated_tokens"] == sum(len(r["tokens"]) - r["prompt_tokens"] for r in rows) > 0
    assert "own continuations" in (out / "report.md").read_text()
    assert info["held_out_data"] == "target continuations"  # the held-out curve reads the target's text too
    assert (out / "features" / "held_out_generated" / "shard-00000.safetensors").is_file()
    assert info["held_out_sequences"] == 2  # --held-out-sequences prompts, continued by the target
    assert not (out / "features" / "held_out").exists()  # no teacher-forced pass over held-out source it never reads


def test_auto_concurrency_follows_the_measured_step_curve(monkeypatch):
    """--generate-concurrency auto: where a step of many rows costs little more than one (AMX, a GPU-like
    flat curve) many continuations run at once; where each row adds as much as a single step costs,
    few; unmeasured curves keep the default."""
    from types import SimpleNamespace

    from specdec.train.generated import DEFAULT_CONCURRENCY, auto_concurrency

    def backend(curve):
        model = SimpleNamespace(config=SimpleNamespace(), mode="test", step_seconds=curve, step_ratios={})
        model.prompt_backend = SimpleNamespace(config=SimpleNamespace(), mode="test", step_ratios={},
                                               step_seconds={128: 0.211, 512: 1.14})  # ~2 ms a prompt row
        return model

    from specdec import step_costs

    monkeypatch.setattr(step_costs, "full_curve", lambda cfg, mode: None)  # the backends' own curves
    flat = backend({1: 0.066, 8: 0.071, 16: 0.078, 32: 0.098})  # the int8 1.5B on a 2-core AMX Xeon
    steep = backend({1: 0.066, 8: 0.5, 16: 1.0, 32: 2.0})  # each row a whole step: batching buys nothing
    assert auto_concurrency(flat, 80, 128) == 64
    assert auto_concurrency(steep, 80, 128) == 8
    assert auto_concurrency(backend(None), 80, 128) == DEFAULT_CONCURRENCY
