"""Tiny randomly initialised models of the real architectures, written as HF directories.

Tests run our decoder against these (and against transformers' implementation of the same weights),
so they need no download and take milliseconds per forward.
"""

from __future__ import annotations

from pathlib import Path

import torch

TINY_QWEN2 = dict(
    model_type="qwen2",
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
#: layer sizes that are whole 256-blocks, for the batch-invariant int4 kernel (kernels/q4.py)
TINY_QWEN2_Q4 = dict(TINY_QWEN2, hidden_size=256, intermediate_size=512, num_hidden_layers=2)
TINY_LLAMA = dict(
    model_type="llama",
    vocab_size=512,
    hidden_size=96,
    intermediate_size=160,
    num_hidden_layers=3,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rope_theta=100_000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)


def make_hf_model(config: dict, seed: int = 0, scale: float = 0.2):
    """A transformers model with the given tiny config and random weights (larger than default init,
    so that logits are far from uniform and greedy decoding is not a sea of ties)."""
    import transformers

    torch.manual_seed(seed)
    cfg_cls = transformers.Qwen2Config if config["model_type"] == "qwen2" else transformers.LlamaConfig
    model_cls = transformers.Qwen2ForCausalLM if config["model_type"] == "qwen2" else transformers.LlamaForCausalLM
    params = {k: v for k, v in config.items() if k != "model_type"}
    model = model_cls(cfg_cls(**params)).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.copy_(scale * torch.randn_like(param))
    return model


def write_tiny_model(out_dir: Path, config: dict = TINY_QWEN2, seed: int = 0) -> Path:
    """Save a tiny random model (config.json + model.safetensors) and return its directory."""
    model = make_hf_model(config, seed)
    model.save_pretrained(out_dir)
    return Path(out_dir)


def assert_chunk_equals_single_tokens(decoder, k: int, prefix: int = 20) -> tuple:
    """Decode ``k`` random tokens after a ``prefix`` once as one chunk and once one at a time; every
    row's logits must be bit-identical (the batch-invariance promise of the int8/int4 modes).
    Returns both caches for further checks."""
    ids = torch.randint(0, 512, (prefix + k,), generator=torch.Generator().manual_seed(k))
    chunk_cache, single_cache = decoder.new_cache(64), decoder.new_cache(64)
    decoder(ids[:prefix], torch.arange(prefix), chunk_cache)
    decoder(ids[:prefix], torch.arange(prefix), single_cache)
    chunk = decoder(ids[prefix:], torch.arange(prefix, prefix + k), chunk_cache)
    for i in range(k):
        single = decoder(ids[prefix + i : prefix + i + 1], torch.tensor([prefix + i]), single_cache)
        assert torch.equal(chunk[i], single[0]), f"row {i} of a {k}-token chunk differs"
    return chunk_cache, single_cache


def require_cpu_kernels() -> None:
    """Skip the calling test module (with the reason) where the C++ CPU kernels cannot be built — no
    compiler, no AVX2: the int8 path still works there. On CI (``CI`` set) a build failure fails:
    its machine has g++ and AVX2."""
    import os

    import pytest

    from specdec.kernels.build import kernel

    try:
        kernel()
    except Exception as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"int4 kernel unavailable: {exc}", allow_module_level=True)
