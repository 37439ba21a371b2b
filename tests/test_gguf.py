"""GGUF loading: tiny files written with the gguf writer, quantized tensors included."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specdec.errors import WeightsError
from specdec.models.config import ModelConfig
from specdec.models.weights import build_decoder, load_decoder
from tests.gguf_fixtures import Q, reference_state, write_tiny_gguf
from tests.model_fixtures import TINY_LLAMA, TINY_QWEN2, make_hf_model

CASES = [("qwen2", TINY_QWEN2, Q.Q8_0), ("qwen2", TINY_QWEN2, Q.Q4_1), ("llama", TINY_LLAMA, Q.Q5_0), ("llama", TINY_LLAMA, Q.Q8_0)]


@pytest.mark.parametrize("arch,config,qtype", CASES, ids=[f"{a}-{q.name}" for a, _, q in CASES])
def test_gguf_loads_to_the_dequantized_reference(tmp_path, arch, config, qtype):
    hf = make_hf_model(config, seed=7)
    path = tmp_path / "tiny.gguf"
    reference = write_tiny_gguf(path, hf, config, matrix_type=qtype)
    model = load_decoder(path)
    from_hf = ModelConfig.from_hf_dict(config)
    assert model.config.arch == arch
    # GGUF stores the norm epsilon as a float32 (1e-6 comes back as 9.99999997e-07); all else is exact
    assert model.config.rms_norm_eps == pytest.approx(from_hf.rms_norm_eps, rel=1e-6)
    assert dataclasses.replace(model.config, rms_norm_eps=from_hf.rms_norm_eps) == from_hf
    ours = dict(model.named_parameters())
    for name, expected in reference_state(reference).items():
        torch.testing.assert_close(ours[name].detach(), expected, atol=0, rtol=0, msg=name)
    # and the whole model computes what a float model with those weights computes
    float_model = build_decoder(model.config, reference_state(reference), torch.float32, "cpu")
    ids = torch.arange(11) * 37 % 512
    torch.testing.assert_close(model(ids, torch.arange(11), model.new_cache(16)), float_model(ids, torch.arange(11), float_model.new_cache(16)))


def test_gguf_config_from_metadata(tmp_path):
    hf = make_hf_model(TINY_QWEN2)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, hf, TINY_QWEN2)
    cfg = load_decoder(path).config
    assert (cfg.arch, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == ("qwen2", 4, 4, 2, 512)
    assert cfg.attention_bias and not cfg.tie_word_embeddings and cfg.rope_theta == 1e6


def test_second_load_uses_the_converted_cache(tmp_path):
    hf = make_hf_model(TINY_QWEN2)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, hf, TINY_QWEN2)
    first = load_decoder(path)
    cached = list(tmp_path.glob("tiny.float32.*.safetensors"))
    assert len(cached) == 1
    second = load_decoder(path)
    for (name, a), (_, b) in zip(first.named_parameters(), second.named_parameters()):
        assert torch.equal(a, b), name


def test_older_cache_formats_are_removed_when_a_new_cache_is_written(tmp_path):
    """A format bump would otherwise leave a model-sized file per old version beside the GGUF."""
    from specdec.models.weights import CACHE_FORMAT_VERSION

    hf = make_hf_model(TINY_QWEN2)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, hf, TINY_QWEN2)
    stale = [tmp_path / f"tiny.float32.v{CACHE_FORMAT_VERSION - 1}.safetensors", tmp_path / "tiny.float32.v1.json"]
    kept = [tmp_path / "tiny.int8.v1.safetensors", tmp_path / f"tiny.float32.v{CACHE_FORMAT_VERSION + 1}.json"]
    for file in stale + kept:
        file.write_bytes(b"old")
    load_decoder(path)
    assert not any(file.exists() for file in stale)
    assert all(file.exists() for file in kept)  # other formats and newer versions are not ours to delete
    assert (tmp_path / f"tiny.float32.v{CACHE_FORMAT_VERSION}.safetensors").is_file()


def test_truncated_gguf_is_a_clear_error(tmp_path):
    hf = make_hf_model(TINY_QWEN2)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, hf, TINY_QWEN2)
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) - 1000])
    with pytest.raises(WeightsError, match="truncated|corrupt"):
        load_decoder(path)


def test_garbage_file_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(WeightsError, match="not a readable GGUF"):
        load_decoder(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(WeightsError, match="no such file"):
        load_decoder(tmp_path / "nope.gguf")


def test_a_gguf_config_is_read_once_per_version_of_the_file(tmp_path, monkeypatch):
    """The gguf reader parses every metadata field (a real model's 151 k-token vocabulary: 7.5 s) to
    answer read_config; the config is kept beside the file and read again only when the file changes."""
    from specdec.models import weights

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, make_hf_model(TINY_QWEN2), TINY_QWEN2)
    first = weights.read_config(path)
    assert len(list(tmp_path.glob("tiny.config.*.json"))) == 1
    weights._gguf_config.cache_clear()  # as a new process would start
    real_open = weights.open_gguf

    def refuse(_path):
        raise AssertionError("the GGUF was parsed again")

    monkeypatch.setattr(weights, "open_gguf", refuse)
    assert weights.read_config(path) == first
    monkeypatch.setattr(weights, "open_gguf", real_open)
    write_tiny_gguf(path, make_hf_model(TINY_LLAMA), TINY_LLAMA)  # another model under the same name
    assert weights.read_config(path).arch == "llama"
