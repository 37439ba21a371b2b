"""Tokenizer wrapper, GGUF tokenizer cache and streaming detokenizer.

Fast tests use the tiny trained BPE (as an HF directory and written into a GGUF); the slow ones
check the real GGUF tokenizers against transformers' own GGUF conversion.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from specdec.errors import SpecdecError, WeightsError
from specdec.models.registry import is_installed, model_file
from specdec.tokenizer import IncrementalDetokenizer, Tokenizer, tokenizer_cache_dir
from tests.tokenizer_fixtures import add_tokenizer_to_gguf, write_tiny_tokenizer

SAMPLES = [
    "def f(x):\n    return 'café 你好 🙂'",
    "  lots   of  spaces\n\n\tand tabs 12345 don't",
    "<|im_start|>user\nhi<|im_end|>\n",
    "cafe\u0301 (combining accent, not NFC) Ångström ﬁ ２",
    "",
]
SPLIT_TEXTS = ["🙂", "你好", "é", "a🚀b", "naïve résumé", "👍🏽", "ﬁ±", "\u0301x"]


def _bytes_to_unicode() -> dict[int, str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return bytes_to_unicode()


def write_tiny_gguf_tokenizer(path: Path, tokenizer_dir: Path, arch: str = "qwen2") -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    add_tokenizer_to_gguf(writer, tokenizer_dir)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))  # a GGUF needs no more here
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return write_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tok(tiny_dir) -> Tokenizer:
    return Tokenizer.load(tiny_dir)


# --- the tiny tokenizer ------------------------------------------------------------------------
def test_fixture_is_deterministic_fast_and_sized(tmp_path, tiny_dir, tok):
    start = time.perf_counter()
    again = write_tiny_tokenizer(tmp_path / "again")
    assert time.perf_counter() - start < 1.0
    assert (again / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    assert tok.vocab_size == 400 == len(tok.tokens())
    assert set(_bytes_to_unicode().values()) <= set(tok.tokens())  # every byte has a token


def test_round_trip_and_specials(tok):
    for text in SAMPLES:
        assert tok.decode(tok.encode(text), skip_special_tokens=False) == text
    assert tok.decode(tok.encode(SAMPLES[2])) == "user\nhi\n"
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert tok.encode("<|im_start|>") == [1]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (None, 2, 0)
    assert tok.stop_token_ids == {0, 2}
    assert tok.token_to_id("<|no such token|>") is None
    assert tok.tokens()[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tok.encode("hello", add_special_tokens=True) == tok.encode("hello", add_special_tokens=False)  # no BOS


def test_chat_template_kwargs_reach_the_template(tiny_dir):
    """vLLM's chat_template_kwargs: variables a template reads (Qwen3's enable_thinking …); not the ones we pass."""
    tok = Tokenizer.load(tiny_dir)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if shout %}!{% endif %}"
    messages = [{"role": "user", "content": "hi"}]
    assert tok.render_chat(messages) == "hi"
    assert tok.render_chat(messages, template_kwargs={"shout": True}) == "hi!"
    with pytest.raises(SpecdecError, match="chat_template_kwargs may not set add_generation_prompt, tools"):
        tok.render_chat(messages, template_kwargs={"tools": [], "add_generation_prompt": False})


def test_chat_template(tok):
    messages = [{"role": "user", "content": "hi"}]
    text = tok.render_chat(messages)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.render_chat(messages, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"
    ids = tok.apply_chat_template(messages)
    assert ids[0] == 1 and ids.count(2) == 1
    assert tok.decode(ids, skip_special_tokens=False) == text
    # OpenAI's list of text parts, as the server takes it (the library handed the list to the template)
    parts = [{"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}]
    assert tok.render_chat(parts) == text
    with pytest.raises(SpecdecError, match="chat message 0: a content part of type 'image_url'; text parts only"):
        tok.render_chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_chat_errors_are_clear(tmp_path, tok):
    directory = write_tiny_tokenizer(tmp_path)
    config = (directory / "tokenizer_config.json").read_text().replace('"chat_template"', '"unused"')
    (directory / "tokenizer_config.json").write_text(config)
    bare = Tokenizer.from_hf_dir(directory)
    assert bare.chat_template is None
    for call in (bare.apply_chat_template, bare.render_chat):
        with pytest.raises(SpecdecError, match="no chat template"):
            call([{"role": "user", "content": "hi"}])
    with pytest.raises(SpecdecError, match="'role' and 'content'"):
        tok.render_chat([{"content": "hi"}])
    # a role the server refuses was rendered by the library as if it were one (templates print any role)
    with pytest.raises(SpecdecError, match="chat message 1: role 'wizard' is not one of system, developer, user"):
        tok.render_chat([{"role": "user", "content": "hi"}, {"role": "wizard", "content": "hi"}])


def test_missing_or_bad_files_are_clear(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "garbage.gguf").write_bytes(b"GGUF" + os.urandom(64))
    cases = [
        (lambda: Tokenizer.load(tmp_path / "empty"), "no tokenizer found"),
        (lambda: Tokenizer.load(tmp_path / "missing"), "no tokenizer found"),
        (lambda: Tokenizer.load(tmp_path / "notes.txt"), "no tokenizer found"),
        (lambda: Tokenizer.from_gguf(tmp_path / "missing.gguf"), "does not exist"),
        (lambda: Tokenizer.from_hf_dir(tmp_path / "missing"), "does not exist"),
        (lambda: Tokenizer.load(tmp_path / "garbage.gguf"), "cannot read the tokenizer"),
    ]
    for call, message in cases:
        with pytest.raises(WeightsError, match=message) as info:
            call()
        assert "\n" not in str(info.value)
    assert not (tmp_path / "garbage.tokenizer").exists()


# --- GGUF --------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_gguf_tokenizer_equals_hf_dir_and_transformers(tmp_path, tiny_dir, tok, arch):
    from transformers import AutoTokenizer

    path = write_tiny_gguf_tokenizer(tmp_path / "tiny.gguf", tiny_dir, arch)
    from_gguf = Tokenizer.load(path)
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in SAMPLES:
        assert from_gguf.encode(text) == tok.encode(text) == reference.encode(text), text
    assert from_gguf.tokens() == tok.tokens()
    for field in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "stop_token_ids", "chat_template"):
        assert getattr(from_gguf, field) == getattr(tok, field), field
    ids = list(range(tok.vocab_size))
    assert from_gguf.decode(ids, skip_special_tokens=False) == tok.decode(ids, skip_special_tokens=False)


def test_gguf_conversion_is_cached_beside_the_file(tmp_path, tiny_dir, monkeypatch):
    path = write_tiny_gguf_tokenizer(tmp_path / "tiny.gguf", tiny_dir)
    first = Tokenizer.from_gguf(path)
    assert tokenizer_cache_dir(path) == tmp_path / "tiny.tokenizer"
    assert (tmp_path / "tiny.tokenizer" / "tokenizer.json").is_file()

    def no_conversion(_path):
        raise AssertionError("converted again instead of using the cache")

    monkeypatch.setattr(Tokenizer, "_convert_gguf", staticmethod(no_conversion))
    second = Tokenizer.from_gguf(path)
    for text in SAMPLES:
        assert second.encode(text) == first.encode(text)
    assert second.chat_template == first.chat_template and second.stop_token_ids == first.stop_token_ids


def test_stale_cache_is_converted_again(tmp_path, tiny_dir):
    path = write_tiny_gguf_tokenizer(tmp_path / "tiny.gguf", tiny_dir)
    assert Tokenizer.from_gguf(path).chat_template is not None
    other = write_tiny_tokenizer(tmp_path / "other")
    config = (other / "tokenizer_config.json").read_text().replace('"chat_template"', '"unused"')
    (other / "tokenizer_config.json").write_text(config)
    write_tiny_gguf_tokenizer(path, other)  # same name, new content
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse-clock file systems
    assert Tokenizer.from_gguf(path).chat_template is None


def test_read_only_folder_caches_under_specdec_home(tmp_path, tiny_dir, monkeypatch):
    path = write_tiny_gguf_tokenizer(tmp_path / "tiny.gguf", tiny_dir)
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(os, "access", lambda *_args, **_kw: False)
    loaded = Tokenizer.from_gguf(path)
    assert loaded.vocab_size == 400
    assert not (tmp_path / "tiny.tokenizer").exists()
    (cached,) = (tmp_path / "home" / "tokenizers").iterdir()
    assert (cached / "tokenizer.json").is_file()


# --- streaming ---------------------------------------------------------------------------------
def _stream(tok: Tokenizer, ids: list[int], skip_special_tokens: bool = True) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip_special_tokens)
    pieces = [detok.push(i) for i in ids]
    tail = detok.flush()
    assert detok.text == "".join(pieces) + tail
    return pieces, tail


def _byte_ids(tok: Tokenizer, data: bytes) -> list[int]:
    """One token per byte: the way a model can emit a character split across tokens."""
    spelling = _bytes_to_unicode()
    return [tok.token_to_id(spelling[b]) for b in data]


def check_streaming(tok: Tokenizer, rng: random.Random, rounds: int) -> None:
    specials = sorted(tok.stop_token_ids)
    for _ in range(rounds):  # arbitrary id sequences, invalid UTF-8 and special tokens included
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 40))]
        ids.insert(rng.randrange(len(ids) + 1), rng.choice(specials))
        for skip in (True, False):
            pieces, tail = _stream(tok, ids, skip)
            assert "".join(pieces) + tail == tok.decode(ids, skip_special_tokens=skip)
    for text in SPLIT_TEXTS:  # characters split across byte tokens, with whole tokens around them
        data = text.encode()
        for _ in range(10):
            cut = rng.randrange(len(data) + 1)
            ids = tok.encode("x ") + _byte_ids(tok, data[:cut]) + tok.encode(data[cut:].decode(errors="ignore"))
            ids = ids[rng.randrange(3) :]  # sometimes start mid-character
            pieces, tail = _stream(tok, ids)
            assert "".join(pieces) + tail == tok.decode(ids)
        pieces, tail = _stream(tok, _byte_ids(tok, data))
        assert "".join(pieces) == text and tail == ""
        assert all("\ufffd" not in piece for piece in pieces)


@pytest.mark.parametrize("seed", range(3))
def test_streaming_detokenizer_equals_decode(tok, seed):
    check_streaming(tok, random.Random(seed), rounds=60)


def test_streaming_holds_back_incomplete_characters(tok):
    ids = _byte_ids(tok, "🙂".encode())
    detok = IncrementalDetokenizer(tok)
    assert [detok.push(i) for i in ids] == ["", "", "", "🙂"]
    detok = IncrementalDetokenizer(tok)
    assert [detok.push(i) for i in ids[:2]] == ["", ""]
    assert detok.flush() == tok.decode(ids[:2]) == "\ufffd"
    detok = IncrementalDetokenizer(tok)
    assert detok.push(tok.token_to_id("<|im_end|>")) == "" and detok.flush() == ""


# --- the real GGUF tokenizers (slow) -----------------------------------------------------------
REAL_TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "Bonjour, ça va? 你好世界 🙂👍🏽 — naïve cafe\u0301",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|fim_prefix|>x = 1<|fim_suffix|>",
    "   indented\n\n\n\ttabs 1234567 [PAD151700] <tool_call>",
]


def real_gguf(name: str) -> Path:
    if not is_installed(name):
        pytest.skip(f"{name} is not installed (run `specdec models pull {name}`)")
    return model_file(name)


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
    return Tokenizer.load(real_gguf("qwen2.5-coder-0.5b"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "smollm2-135m"])
def test_real_gguf_matches_transformers_and_caches(tmp_path, name):
    """A fresh conversion (GGUF linked into an empty folder) == transformers' own; then the cached load."""
    from transformers import AutoTokenizer

    link = tmp_path / f"{name}.gguf"
    link.symlink_to(real_gguf(name))
    start = time.perf_counter()
    first = Tokenizer.from_gguf(link)
    converted_s = time.perf_counter() - start
    start = time.perf_counter()
    second = Tokenizer.from_gguf(link)
    cached_s = time.perf_counter() - start
    print(f"\n{name}: first load (conversion) {converted_s:.1f} s, cached load {cached_s:.2f} s")
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=link.name)
    for text in REAL_TEXTS:
        assert first.encode(text) == second.encode(text) == reference.encode(text), text
        assert first.decode(first.encode(text), skip_special_tokens=False) == text
    assert first.tokens() == reference.convert_ids_to_tokens(list(range(len(reference))))
    assert first.chat_template == reference.chat_template and first.chat_template
    assert cached_s < converted_s


@pytest.mark.slow
def test_real_qwen_specials_and_chat(qwen):
    assert qwen.vocab_size == 151936  # 151665 real tokens + 271 "[PAD…]" fillers up to the embedding rows
    assert (qwen.bos_token_id, qwen.eos_token_id, qwen.pad_token_id) == (151643, 151645, 151643)
    assert {151643, 151645} <= qwen.stop_token_ids
    assert qwen.encode("hi") == qwen.encode("hi", add_special_tokens=False)  # no BOS
    text = qwen.render_chat([{"role": "user", "content": "hi"}])
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert qwen.apply_chat_template([{"role": "user", "content": "hi"}])[-3:] == [151644, 77091, 198]


@pytest.mark.slow
def test_real_vocabularies_same_pair_and_mismatch(qwen):
    target = Tokenizer.load(real_gguf("qwen2.5-coder-1.5b"))
    smol = Tokenizer.load(real_gguf("smollm2-135m"))
    assert target.tokens() == qwen.tokens() and target.stop_token_ids == qwen.stop_token_ids
    assert smol.vocab_size == 49152 and smol.tokens()[:100] != qwen.tokens()[:100]
    assert smol.stop_token_ids == {0, 2}  # <|endoftext|>, <|im_end|> (EOS)


@pytest.mark.slow
def test_real_qwen_streaming(qwen):
    check_streaming(qwen, random.Random(0), rounds=30)
