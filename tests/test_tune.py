"""`specdec tune`: measures the candidates on the user's prompts, picks an exact configuration, writes a
file generate/serve/bench read with --config (command-line flags win), exports it, and resumes."""

from __future__ import annotations

import json

import pytest

from specdec.bench.runner import RequestResult
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.tune import MIN_SPEEDUP, choose, read_settings


def result(method: str, prompt: str, tokens: int, wall: float, mismatch: bool = False) -> RequestResult:
    return RequestResult(prompt, "c", method, 0, 0, list(range(tokens)), {"acceptance_rate": 0.5}, wall, mismatch)


def test_choose_takes_the_fastest_exact_configuration_or_plain():
    runs = [result("ar", "p", 100, 10.0), result("ngram@auto", "p", 100, 8.0), result("suffix@3", "p", 100, 5.0, mismatch=True),
            result("draft_model@3", "p", 100, 6.0)]
    assert choose(runs)[:2] == ("draft_model", 3)  # suffix was faster but changed the output
    slow = [result("ar", "p", 100, 10.0), result("ngram", "p", 100, 10.0 / (MIN_SPEEDUP - 0.01))]
    assert choose(slow)[:2] == (None, None)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def add(a, b):", "class Stack:", "for i in range("]))
    return path


def test_tune_writes_a_config_that_generate_reads_and_resumes(tiny_dirs, prompts, tmp_path, capsys):
    out = tmp_path / "tune"
    base = ["--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]), "--dtype", "float32",
            "--quantize", "none", "--prompts", str(prompts), "--max-tokens", "12", "--out", str(out)]
    assert main(["tune", *base, "--gammas", "auto,2", "--export", "vllm"]) == 0
    printed = capsys.readouterr().out
    assert "chosen:" in printed and (out / "report.md").is_file() and (out / "speedup.png").is_file()
    chosen = json.loads((out / "tune.json").read_text())
    table = chosen["measured"]["table"]["overall"]
    assert {"ar", "ngram@auto", "suffix@2", "draft_model@auto", "draft_suffix@2"} <= set(table)
    assert all(figures["mismatches"] == 0 for figures in table.values())
    assert chosen["measured"]["prompts"] == 3
    settings = read_settings(out / "tune.json")
    assert set(settings) >= {"method", "num_speculative_tokens", "model", "draft_model", "quantize"}
    if settings["method"] is not None:
        assert (out / "vllm.sh").read_text().startswith("# vllm")
    lines = (out / "measurements.jsonl").read_text().count("\n")
    assert main(["tune", *base, "--gammas", "auto,2"]) == 0  # resumed: nothing measured again
    assert (out / "measurements.jsonl").read_text().count("\n") == lines
    capsys.readouterr()

    forced = dict(settings, method="ngram", num_speculative_tokens=3, draft_model=None)
    (out / "forced.json").write_text(json.dumps({"settings": forced}))
    assert main(["generate", "def f(x):", "--config", str(out / "forced.json"), "--max-tokens", "8", "--ignore-eos"]) == 0
    assert "method=ngram" in capsys.readouterr().err
    assert main(["generate", "def f(x):", "--config", str(out / "forced.json"), "--method", "suffix",
                 "--max-tokens", "8", "--ignore-eos"]) == 0  # a typed flag wins over the file
    assert "method=suffix" in capsys.readouterr().err


def test_bad_config_files_are_clear_errors(tmp_path, capsys):
    with pytest.raises(SpecdecError, match="no such file"):
        read_settings(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(SpecdecError, match="not JSON"):
        read_settings(tmp_path / "bad.json")
    (tmp_path / "odd.json").write_text(json.dumps({"settings": {"warp_drive": 9}}))
    assert main(["generate", "x", "--config", str(tmp_path / "odd.json")]) == 1
    assert "'warp_drive' is not a setting" in capsys.readouterr().err


def test_a_typed_flag_equal_to_its_default_still_wins(tmp_path):
    from specdec.cli import typed_flags

    assert {"draft_model", "method"} <= typed_flags(["bench", "--draft-model", "qwen2.5-coder-0.5b", "--method", "ngram"])
    assert "draft_model" not in typed_flags(["bench"])
