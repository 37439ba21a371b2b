"""Self-distillation data (specdec.train.generated): prompts drawn from code, the target's own
continuations, resumable, and train-drafter using them."""

from __future__ import annotations

import json

import pytest

import specdec
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.train.data import Document, file_documents
from specdec.train.generated import (function_prompts, generate_sequences, generated_sequences, held_out_prompts,
                                     read_generated)

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
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(files):
        (root / f"mod{i}.py").write_text("".join(f'def f{i}_{j}(x):\n    """Scale x by {j}."""\n    return x * {j} + {i}\n\n'
                                                for j in range(3)))
    return root


def test_continuations_are_the_targets_own_and_a_resumed_run_adds_only_new_prompts(tiny_target, tmp_path):
    docs = file_documents(corpus(tmp_path, 12))
    path = tmp_path / "generated.jsonl"
    rows = generate_sequences(tiny_target, docs, path, minutes=10, new_tokens=6, concurrency=4)
    train_docs = [d for d in docs if not d.held_out]
    assert len(rows) == 3 * len(train_docs) and len({r["name"] for r in rows}) == len(rows)
    params = specdec.SamplingParams(max_tokens=6, temperature=0.0)
    for row in rows[:3]:  # greedy continuations, the same as generating alone
        prompt = row["tokens"][: row["prompt_tokens"]]
        assert row["tokens"][row["prompt_tokens"]:] == specdec.generate(tiny_target, prompt, params).token_ids
    with path.open("a") as sink:
        sink.write('{"name": "torn')  # a run cut mid-write
    assert generate_sequences(tiny_target, docs, path, minutes=10, new_tokens=6) == rows  # nothing left to do
    assert read_generated(path) == rows
    lost = rows.pop()  # as if the run had been cut while writing its last row
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + json.dumps(lost)[:20])
    assert generate_sequences(tiny_target, docs, path, minutes=10, new_tokens=6)[-1] == lost  # made again
    rows.append(lost)
    assert read_generated(path) == rows
    assert generate_sequences(tiny_target, docs, path, minutes=0, new_tokens=6) == rows
    sequences = generated_sequences(rows, seq_len=8)
    assert len(sequences) == len(rows) and all(len(s) == 8 for s in sequences)
    held = held_out_prompts(docs, tiny_target.tokenizer.encode, 2)
    assert held and all(tiny_target.tokenizer.decode(ids).startswith("def f") for ids in held)


def test_data_without_prompts_is_a_clear_error(tiny_target, tmp_path):
    with pytest.raises(SpecdecError, match="no prompts"):
        generate_sequences(tiny_target, [Document("a.txt", "short")], tmp_path / "g.jsonl", minutes=1, new_tokens=4)


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
