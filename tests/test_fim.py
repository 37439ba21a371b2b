"""Fill in the middle: completions' ``suffix`` becomes the code model's FIM prompt (prefix, suffix,
middle tokens), answered like any prompt — speculative and exact; a model without FIM tokens, token-id
prompts with a suffix and ``echo`` with one are 400s."""

from __future__ import annotations

import shutil

import httpx
import pytest

import specdec
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams
from tests.test_server import launch, serving

FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
PREFIX, SUFFIX = "def area(w, h):\n    ", "\n\nprint(area(2, 3))"


def with_fim_tokens(source, destination):  # noqa: ANN001, ANN201 - Paths
    """A copy of a tiny model directory with Qwen2.5-Coder's three FIM tokens added to its tokenizer."""
    from tokenizers import Tokenizer

    shutil.copytree(source, destination)
    tokenizer = Tokenizer.from_file(str(destination / "tokenizer.json"))
    tokenizer.add_special_tokens(FIM)
    tokenizer.save(str(destination / "tokenizer.json"))
    return destination


@pytest.fixture(scope="module")
def fim_dirs(tiny_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("fim")
    return {role: with_fim_tokens(tiny_dirs[role], root / role) for role in ("target", "draft")}


@pytest.fixture(scope="module")
def fim_dir(fim_dirs):
    return fim_dirs["target"]


def test_the_fim_prompt_is_prefix_suffix_middle(fim_dir, tiny_target):
    tokenizer = specdec.load_model(fim_dir, dtype="float32", device="cpu").tokenizer
    start, hole, middle = (tokenizer.token_to_id(name) for name in FIM)
    ids = tokenizer.fill_in_the_middle(PREFIX, SUFFIX)
    assert ids == [start, *tokenizer.encode(PREFIX, add_special_tokens=False), hole,
                   *tokenizer.encode(SUFFIX, add_special_tokens=False), middle]
    with pytest.raises(SpecdecError, match="no fill-in-the-middle tokens"):
        tiny_target.tokenizer.fill_in_the_middle(PREFIX, SUFFIX)


def test_server_suffix_fills_the_middle_as_the_library_does(fim_dir, fim_dirs):
    target = specdec.load_model(fim_dir, dtype="float32", device="cpu")
    ids = target.tokenizer.fill_in_the_middle(PREFIX, SUFFIX)
    expected = specdec.generate(target, ids, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    with serving(launch("--model", str(fim_dir), "--draft-model", str(fim_dirs["draft"]), "--dtype", "float32",
                        "--quantize", "none", "--served-model-name", "tiny", "--num-speculative-tokens", "3")) as base:
        body = {"model": "tiny", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        answer = httpx.post(f"{base}/v1/completions", json=body, timeout=60).json()
        assert answer["choices"][0]["text"] == expected.text
        assert answer["usage"]["prompt_tokens"] == len(ids)
        assert answer["usage"]["speculative"]["draft_tokens"] > 0  # speculated, and still the plain answer
        for bad, fragment in (({"prompt": [1, 2, 3]}, "suffix needs text prompts"), ({"echo": True}, "echo cannot be combined")):
            response = httpx.post(f"{base}/v1/completions", json={**body, **bad}, timeout=60)
            assert response.status_code == 400 and fragment in response.json()["error"]["message"]


def test_server_suffix_without_fim_tokens_is_a_400(tiny_dirs):
    with serving(launch("--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none",
                        "--served-model-name", "tiny")) as base:
        response = httpx.post(f"{base}/v1/completions", timeout=60,
                              json={"model": "tiny", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 4})
        assert response.status_code == 400 and "no fill-in-the-middle tokens" in response.json()["error"]["message"]
        assert response.json()["error"]["param"] == "suffix"


@pytest.mark.slow
def test_the_real_default_model_fills_the_middle():
    target = specdec.load_model("qwen2.5-coder-1.5b", quantize="int8")
    draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
    ids = target.tokenizer.fill_in_the_middle("def add(a, b):\n    ", "\n\nprint(add(1, 2))")
    params = SamplingParams(temperature=0, max_tokens=16)
    plain = specdec.generate(target, ids, params)
    speculative = specdec.generate(target, ids, params, draft=draft)
    assert "return a + b" in plain.text and speculative.token_ids == plain.token_ids


def test_cli_generate_suffix_fills_the_middle(fim_dir, capsys):
    from specdec.cli import main

    target = specdec.load_model(fim_dir, dtype="float32", device="cpu")
    expected = specdec.generate(target, target.tokenizer.fill_in_the_middle(PREFIX, SUFFIX),
                                SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    model = ["--model", str(fim_dir), "--dtype", "float32", "--quantize", "none", "--max-tokens", "10", "--ignore-eos"]
    assert main(["generate", PREFIX, "--suffix", SUFFIX, *model]) == 0
    assert capsys.readouterr().out == expected.text + "\n"
    assert main(["generate", PREFIX, "--suffix", SUFFIX, "--chat", *model]) == 1
    assert "--suffix fills the middle of a plain prompt" in capsys.readouterr().err
