"""`specdec export`: the configuration in vLLM / SGLang / llama.cpp terms, with notes where they lack the method."""

from __future__ import annotations

import json
import shlex

import pytest

from specdec.cli import main
from specdec.config import SpecConfig
from specdec.errors import SpecdecError
from specdec.exports import export


def flags(command: list[str]) -> dict[str, str]:
    return {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("-")}


def test_vllm_speculative_config_json():
    out = export("vllm", "qwen2.5-coder-1.5b", SpecConfig(method="draft_model", num_speculative_tokens=5), "qwen2.5-coder-0.5b")
    assert out.command[:3] == ["vllm", "serve", "Qwen/Qwen2.5-Coder-1.5B-Instruct"]
    config = json.loads(flags(out.command)["--speculative-config"])
    assert config == {"method": "draft_model", "model": "Qwen/Qwen2.5-Coder-0.5B-Instruct", "num_speculative_tokens": 5}
    ngram = json.loads(flags(export("vllm", "qwen2.5-coder-1.5b", SpecConfig(method="ngram", prompt_lookup_max=3)).command)
                       ["--speculative-config"])
    assert ngram == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def test_sglang_standalone_chain_and_llamacpp_gguf_flags():
    spec = SpecConfig(method="draft_model", num_speculative_tokens=3)
    sglang = flags(export("sglang", "qwen2.5-coder-1.5b", spec, "qwen2.5-coder-0.5b").command)
    assert sglang["--speculative-algorithm"] == "STANDALONE" and sglang["--speculative-num-steps"] == "3"
    assert sglang["--speculative-eagle-topk"] == "1" and sglang["--speculative-num-draft-tokens"] == "4"
    llama = export("llamacpp", "qwen2.5-coder-1.5b", spec, "qwen2.5-coder-0.5b")
    given = flags(llama.command)
    assert given["-m"].endswith("qwen2.5-coder-1.5b.gguf") and given["-md"].endswith("qwen2.5-coder-0.5b.gguf")
    assert given["--spec-draft-n-max"] == "3" and given["--spec-draft-p-min"] == "0"  # specdec drafts all 3 at a fixed γ
    cut = flags(export("llamacpp", "qwen2.5-coder-1.5b", SpecConfig(method="draft_model"), "qwen2.5-coder-0.5b").command)
    assert cut["--spec-draft-n-max"] == "4" and cut["--spec-draft-p-min"] == "0.3"  # γ=auto: the confidence cut
    assert given["--spec-type"] == "draft-simple"  # without it some llama-server builds load the draft and never draft


def test_settings_an_engine_lacks_are_said():
    """The draft-confidence cut, n-gram lookup bounds and SGLang's tree are notes; vLLM's suffix decoding sizes its own
    drafts (a fixed γ=4 would cap its default 24)."""
    draft = export("vllm", "qwen2.5-coder-1.5b", SpecConfig(method="draft_model"), "qwen2.5-coder-0.5b")
    assert any("--draft-confidence-threshold 0.3" in note and "no counterpart" in note for note in draft.notes)
    none = export("vllm", "qwen2.5-coder-1.5b", SpecConfig(method="draft_model", draft_confidence_threshold=0.0), "qwen2.5-coder-0.5b")
    assert not any("confidence" in note for note in none.notes)
    suffix = export("vllm", "qwen2.5-coder-1.5b", SpecConfig(method="suffix", num_speculative_tokens="auto"))
    assert json.loads(flags(suffix.command)["--speculative-config"]) == {"method": "suffix"}
    assert any("num_speculative_tokens left out" in note for note in suffix.notes)
    fixed = export("vllm", "qwen2.5-coder-1.5b", SpecConfig(method="suffix", num_speculative_tokens=6))
    assert json.loads(flags(fixed.command)["--speculative-config"])["num_speculative_tokens"] == 6
    ngram = export("llamacpp", "qwen2.5-coder-1.5b", SpecConfig(method="ngram", prompt_lookup_min=2, prompt_lookup_max=5))
    assert flags(ngram.command)["--spec-ngram-simple-size-n"] == "5"
    assert any("prompt_lookup_min 2" in note for note in ngram.notes)
    sglang = export("sglang", "qwen2.5-coder-1.5b", SpecConfig(method="ngram", num_speculative_tokens=3))
    assert flags(sglang.command)["--speculative-num-draft-tokens"] == "4"
    assert any("tree of 4 tokens" in note for note in sglang.notes)
    mtp = export("vllm", "qwen2.5-coder-1.5b", SpecConfig(method="mtp"))
    assert any("built-in prediction layers" in note for note in mtp.notes)


def test_missing_methods_and_auto_gamma_are_said_not_hidden():
    out = export("llamacpp", "qwen2.5-coder-1.5b", SpecConfig(method="layer_skip", num_speculative_tokens="auto"))
    assert any("no 'layer_skip'" in note for note in out.notes) and any("auto" in note for note in out.notes)
    assert flags(out.command)["--spec-type"] == "ngram-simple"
    hybrid = export("vllm", "qwen2.5-coder-1.5b", SpecConfig(method="draft_suffix", num_speculative_tokens=4), "qwen2.5-coder-0.5b")
    assert json.loads(flags(hybrid.command)["--speculative-config"])["method"] == "draft_model"
    assert any("hybrid" in note for note in hybrid.notes)
    text = hybrid.render()
    assert text.splitlines()[-1] == shlex.join(hybrid.command) and text.count("# note:") == 1  # fixed γ: no cut to note
    assert text.startswith("# vLLM: the speculative configuration given to specdec, in vLLM's terms")
    # vLLM and SGLang do serve EAGLE heads (in their formats): the note said they had no such method
    head = export("sglang", "qwen2.5-coder-1.5b", SpecConfig(method="eagle"))
    assert any("specdec's trained eagle heads are not in SGLang's checkpoint format" in note for note in head.notes)
    # a draft model the method does not read was dropped without a word
    ngram = export("vllm", "qwen2.5-coder-1.5b", SpecConfig(method="ngram"), "qwen2.5-coder-0.5b")
    assert any("--draft-model qwen2.5-coder-0.5b is not exported" in note for note in ngram.notes)


def test_bad_exports_are_clear_errors(tmp_path):
    with pytest.raises(SpecdecError, match="unknown engine"):
        export("tgi", "qwen2.5-coder-1.5b", SpecConfig(method="ngram"))
    with pytest.raises(SpecdecError, match="nothing to export"):
        export("vllm", "qwen2.5-coder-1.5b", SpecConfig())
    with pytest.raises(SpecdecError, match="needs --draft-model"):
        export("vllm", "qwen2.5-coder-1.5b", SpecConfig(method="draft_model"))
    with pytest.raises(SpecdecError, match="GGUF"):
        export("llamacpp", str(tmp_path), SpecConfig(method="ngram"))


def test_export_refuses_a_pair_of_different_vocabularies(tiny_dirs, tmp_path, capsys):
    """A draft of another vocabulary was written out for the other engine to refuse (or worse, accept: vLLM
    checks only the vocabulary size); pairs on this machine are compared as generate compares them."""
    from tests.model_fixtures import write_tiny_model
    from tests.tokenizer_fixtures import write_tiny_tokenizer

    write_tiny_model(tmp_path, seed=5)
    write_tiny_tokenizer(tmp_path, vocab_size=300)
    assert main(["export", "--engine", "vllm", "--model", str(tiny_dirs["target"]), "--draft-model", str(tmp_path)]) == 1
    assert "has 300 tokens" in capsys.readouterr().err
    assert main(["export", "--engine", "vllm", "--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"])]) == 0
    assert "vllm serve" in capsys.readouterr().out
    assert main(["export", "--engine", "vllm", "--model", str(tiny_dirs["target"]), "--draft-model", "Qwen/Qwen2.5-0.5B"]) == 0
    assert "note: Qwen/Qwen2.5-0.5B is not on this machine" in capsys.readouterr().err


def test_cli_writes_the_command(tmp_path, capsys):
    out = tmp_path / "serve.sh"
    assert main(["export", "--engine", "sglang", "--draft-model", "qwen2.5-coder-0.5b", "--out", str(out)]) == 0
    assert "--speculative-algorithm STANDALONE" in out.read_text()
    assert main(["export", "--engine", "vllm"]) == 1
    assert "nothing to export" in capsys.readouterr().err


def test_export_reads_a_tune_result_its_folder_too(tmp_path, capsys):
    """`export --config tune-out/tune.json` was "unrecognized arguments"; tune's other settings (execution modes)
    are not export's business and are skipped, flags typed win."""
    import json

    out = tmp_path / "tune-out"
    out.mkdir()
    (out / "tune.json").write_text(json.dumps({"settings": {
        "model": "qwen2.5-coder-1.5b", "draft_model": None, "method": "ngram", "num_speculative_tokens": 3,
        "quantize": "int4", "draft_quantize": "int4", "spec_tree": "off"}}))
    assert main(["export", "--engine", "vllm", "--config", str(out)]) == 0
    command = capsys.readouterr().out
    assert '"num_speculative_tokens": 3' in command and '"method": "ngram"' in command
    assert main(["export", "--engine", "vllm", "--config", str(out / "tune.json"), "--num-speculative-tokens", "5"]) == 0
    assert '"num_speculative_tokens": 5' in capsys.readouterr().out


def test_a_tune_file_that_chose_plain_decoding_has_nothing_to_export(tmp_path, capsys):
    """It was "num_speculative_tokens: null is not a value of --num-speculative-tokens"."""
    config = tmp_path / "tune.json"
    config.write_text(json.dumps({"settings": {"model": "qwen2.5-coder-1.5b", "draft_model": None, "method": None,
                                               "num_speculative_tokens": None, "quantize": "int8"}}))
    assert main(["export", "--engine", "vllm", "--config", str(config)]) == 1
    assert "tune chose plain decoding there" in capsys.readouterr().err
    assert main(["export", "--engine", "vllm", "--config", str(config), "--method", "ngram"]) == 0  # a typed method wins
