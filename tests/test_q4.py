"""int4 target path (4-bit weights × int8 activations, models/q4.py): accuracy, the GGUF Q4_K
weights reproduced exactly, and bit-identical logits alone vs inside a verification chunk."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from specdec.models.q4 import Q4Linear, kernel

try:
    kernel()
except Exception as exc:  # no compiler / no AVX2: the int8 path still works; say why these are skipped
    if os.environ.get("CI"):  # CI's machine has g++ and AVX2: a build failure there is a failure
        raise
    pytest.skip(f"int4 kernel unavailable: {exc}", allow_module_level=True)


def test_q4_linear_close_to_its_weights_and_to_float():
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 512, generator=gen) * 0.02, torch.randn(96, generator=gen)
    x = torch.randn(5, 512, generator=gen)
    layer = Q4Linear.from_float(weight, bias)
    out = layer(x)
    exact = torch.nn.functional.linear(x, layer.dequantized(), bias)
    # stated bounds: per-token int8 activations cost ≤ 2% per row; 4-bit weights ≤ 12% vs float
    assert ((out - exact).norm(dim=-1) / exact.norm(dim=-1)).max() < 0.02
    ref = torch.nn.functional.linear(x, weight, bias)
    assert ((out - ref).norm(dim=-1) / ref.norm(dim=-1)).max() < 0.12


@pytest.mark.parametrize("rows", [2, 5, 8, 9, 17])
@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_rows_bit_identical_alone_and_in_a_chunk(rows, kind):
    """The kernels tile rows by 8: every tile size and remainder must give a row the same bits."""
    from specdec.models.q4 import Q8Linear

    gen = torch.Generator().manual_seed(rows)
    layer = (Q4Linear if kind == "q4" else Q8Linear).from_float(torch.randn(40, 768, generator=gen) * 0.05)
    x = torch.randn(rows, 768, generator=gen)
    x[1] *= 50  # an outlier row must not change its neighbours (per-token scales)
    chunk = layer(x)
    for i in range(rows):
        assert torch.equal(chunk[i], layer(x[i : i + 1])[0]), f"row {i} of {rows}"


def test_q8_linear_close_to_float():
    from specdec.models.q4 import Q8Linear

    gen = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(96, 512, generator=gen) * 0.02, torch.randn(96, generator=gen)
    x = torch.randn(5, 512, generator=gen)
    ref = torch.nn.functional.linear(x, weight, bias)
    out = Q8Linear.from_float(weight, bias)(x)
    assert ((out - ref).norm(dim=-1) / ref.norm(dim=-1)).max() < 0.02  # 8-bit weights and activations


def test_q4k_blocks_reproduce_the_gguf_weights_exactly():
    """Raw Q4_K bytes → our layer → the very weights gguf's reference dequantizer gives."""
    import gguf

    rng = np.random.default_rng(0)
    rows, blocks = 6, 3
    raw = rng.integers(0, 256, size=(rows, blocks, 144), dtype=np.uint8)
    scales = rng.uniform(1e-4, 1e-2, size=(rows, blocks, 2)).astype(np.float16)
    raw[..., 0:4] = scales.view(np.uint8).reshape(rows, blocks, 4)
    raw = raw.reshape(rows, blocks * 144)
    layer = Q4Linear.from_q4k(raw)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K).reshape(rows, blocks * 256)
    assert torch.equal(layer.dequantized(), torch.from_numpy(np.asarray(ref, dtype=np.float32)))


def test_input_size_must_be_whole_blocks():
    from specdec.errors import SpecdecError

    with pytest.raises(SpecdecError, match="divisible by 256"):
        Q4Linear.from_float(torch.randn(8, 96))


@pytest.fixture(scope="module")
def q4_dirs(tmp_path_factory):
    from tests.conftest import make_tiny_model_dir
    from tests.model_fixtures import TINY_QWEN2_Q4

    root = tmp_path_factory.mktemp("q4")
    return {"target": make_tiny_model_dir(root / "target", TINY_QWEN2_Q4, seed=3),
            "draft": make_tiny_model_dir(root / "draft", TINY_QWEN2_Q4, seed=4)}


@pytest.fixture(scope="module")
def q4_target(q4_dirs):
    import specdec

    return specdec.load_model(q4_dirs["target"], dtype="float32", device="cpu", quantize="int4")


def test_int4_target_layers(q4_target):
    from specdec.models.q4 import Q8Linear

    decoder = q4_target.backend.decoder
    assert q4_target.backend.dtype_name == "int4"
    assert isinstance(decoder.model.layers[0].mlp.down_proj, Q4Linear)
    assert isinstance(decoder.lm_head, Q8Linear)  # logits keep 8 bits
    assert "fused_qkv" in decoder.model.layers[0].self_attn.__dict__


@pytest.mark.parametrize("k", [1, 3, 6, 9])
def test_int4_chunk_logits_bit_identical_to_single_tokens(q4_target, k):
    from tests.model_fixtures import assert_chunk_equals_single_tokens

    assert_chunk_equals_single_tokens(q4_target.backend.decoder, k)


@pytest.mark.parametrize("method", ["draft_model", "ngram", "suffix"])
def test_int4_greedy_speculation_equals_plain(q4_dirs, q4_target, method):
    import specdec

    draft = specdec.load_model(q4_dirs["draft"], dtype="float32", device="cpu", quantize="int4") \
        if method == "draft_model" else None
    params = specdec.SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    spec = specdec.SpecConfig(method=method, num_speculative_tokens=4)
    for prompt in ([1, 2, 3], [7, 7, 7, 7, 40, 7, 7, 7], list(range(60, 90)) * 2):
        plain = specdec.generate(q4_target, prompt, params)
        assert specdec.generate(q4_target, prompt, params, draft=draft, spec=spec).token_ids == plain.token_ids


def test_int4_state_round_trip(q4_target, tmp_path):
    """The cached conversion (weights.py) restores the same layers and bit-identical logits."""
    from safetensors.torch import load_file, save_file

    from specdec.models.quant import load_quantized_state, quantized_state
    from specdec.models.transformer import Decoder

    decoder = q4_target.backend.decoder
    save_file(quantized_state(decoder), str(tmp_path / "q.safetensors"))
    with torch.device("meta"):
        skeleton = Decoder(decoder.config)
    restored = load_quantized_state(skeleton, load_file(str(tmp_path / "q.safetensors")))
    restored.rope_cos, restored.rope_sin = decoder.rope_cos, decoder.rope_sin
    assert restored.quantization == "int4" and isinstance(restored.model.layers[1].mlp.up_proj, Q4Linear)
    ids = torch.arange(12) * 11 % 512
    assert torch.equal(decoder(ids, torch.arange(12), decoder.new_cache(16)), restored(ids, torch.arange(12), restored.new_cache(16)))
