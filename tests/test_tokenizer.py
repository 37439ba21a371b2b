"""Tokenizer wrapper and streaming detokenizer (tiny trained BPE; slow checks on the real GGUFs)."""

from __future__ import annotations

import random

import pytest

from specdec.errors import SpecdecError, WeightsError
from specdec.models.registry import is_installed, model_file
from specdec.tokenizer import IncrementalDetokenizer, Tokenizer
from tests.tokenizer_fixtures import write_tiny_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Tokenizer.load(write_tiny_tokenizer(tmp_path_factory.mktemp("tok")))


def test_round_trip_and_specials(tok):
    text = "def f(x):\n    return 'café 你好 🙂'"
    assert tok.decode(tok.encode(text)) == text
    assert tok.eos_token_id == tok.token_to_id("<|im_end|>")
    assert tok.stop_token_ids == {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
    assert len(tok.tokens()) == tok.vocab_size


def test_chat_template(tok):
    text = tok.render_chat([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok.apply_chat_template([{"role": "user", "content": "hi"}]), skip_special_tokens=False) == text


def test_missing_chat_template_is_clear(tok):
    bare = Tokenizer(tok.hf)
    bare.chat_template = None
    with pytest.raises(SpecdecError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "hi"}])


def test_missing_tokenizer_is_clear(tmp_path):
    with pytest.raises(WeightsError, match="no tokenizer"):
        Tokenizer.load(tmp_path)


@pytest.mark.parametrize("seed", range(4))
def test_streaming_detokenizer_equals_decode(tok, seed):
    rng = random.Random(seed)
    for _ in range(100):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 40))]
        detok = IncrementalDetokenizer(tok)
        streamed = "".join(detok.push(i) for i in ids) + detok.flush()
        assert streamed == tok.decode(ids)


def test_streaming_never_emits_broken_characters(tok):
    ids = tok.encode("🙂 你好 café")
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + detok.flush() == "🙂 你好 café"


@pytest.mark.slow
def test_real_qwen_and_smollm_tokenizers():
    for name in ("qwen2.5-coder-0.5b", "smollm2-135m"):
        if not is_installed(name):
            pytest.skip(f"{name} not installed")
    qwen = Tokenizer.load(model_file("qwen2.5-coder-0.5b"))
    smol = Tokenizer.load(model_file("smollm2-135m"))
    assert {151643, 151645} <= qwen.stop_token_ids
    assert qwen.vocab_size != smol.vocab_size
    assert qwen.decode(qwen.encode("def add(a, b):\n    return a + b")) == "def add(a, b):\n    return a + b"
    assert "<|im_start|>assistant" in qwen.render_chat([{"role": "user", "content": "hi"}])
