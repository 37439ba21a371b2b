"""int8 path: accuracy of the quantized linear, and bit-identical logits alone vs in a chunk."""

from __future__ import annotations

import pytest
import torch

from specdec.kernels.convert import load_quantized_state, quantize_decoder, quantized_state
from specdec.kernels.int8 import Int8Linear
from specdec.models.weights import load_decoder
from tests.model_fixtures import TINY_LLAMA, TINY_QWEN2, assert_chunk_equals_single_tokens, write_tiny_model


def test_int8_linear_close_to_float():
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 64, generator=gen) * 0.05, torch.randn(96, generator=gen)
    x = torch.randn(7, 64, generator=gen)
    layer = Int8Linear.from_float(weight, bias)
    ref = torch.nn.functional.linear(x, weight, bias)
    rel = ((layer(x) - ref).norm(dim=-1) / ref.norm(dim=-1)).max()
    assert rel < 0.03  # stated bound: 3% relative error per row for 8-bit weights and activations


def test_per_token_scales_isolate_outliers_and_rows():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(128, 64, generator=gen) * 0.05
    layer = Int8Linear.from_float(weight)
    x = torch.randn(5, 64, generator=gen)
    x_outlier = x.clone()
    x_outlier[2] *= 30
    alone = layer(x[:1])
    assert torch.equal(layer(x)[0], alone[0])  # bit-identical whatever else is in the chunk
    assert torch.equal(layer(x_outlier)[0], alone[0])
    ref = x @ weight.t()
    rel = ((layer(x_outlier)[[0, 1, 3, 4]] - ref[[0, 1, 3, 4]]).norm(dim=-1) / ref[[0, 1, 3, 4]].norm(dim=-1)).max()
    assert rel < 0.03


@pytest.fixture(params=["qwen2", "llama"])
def quantized(request, tmp_path):
    write_tiny_model(tmp_path, TINY_QWEN2 if request.param == "qwen2" else TINY_LLAMA, seed=2)
    return quantize_decoder(load_decoder(tmp_path))


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_chunk_logits_bit_identical_to_single_tokens(quantized, k):
    chunk_cache, single_cache = assert_chunk_equals_single_tokens(quantized, k)
    assert torch.equal(chunk_cache.k[:, :, : 20 + k], single_cache.k[:, :, : 20 + k])


def test_rollback_then_redecode_is_bit_identical(quantized):
    ids = torch.randint(0, 512, (16,), generator=torch.Generator().manual_seed(9))
    cache = quantized.new_cache(32)
    quantized(ids[:10], torch.arange(10), cache)
    first = quantized(ids[10:14], torch.arange(10, 14), cache)
    cache.truncate(11)
    again = quantized(ids[11:14], torch.arange(11, 14), cache)
    assert torch.equal(first[1:], again)


def test_quantized_state_round_trip(quantized, tmp_path):
    from safetensors.torch import load_file, save_file

    from specdec.models.transformer import Decoder

    save_file(quantized_state(quantized), str(tmp_path / "q.safetensors"))
    with torch.device("meta"):
        skeleton = Decoder(quantized.config)
    restored = load_quantized_state(skeleton, load_file(str(tmp_path / "q.safetensors")))
    restored.rope_cos, restored.rope_sin = quantized.rope_cos, quantized.rope_sin
    if quantized.config.tie_word_embeddings:
        assert restored.lm_head is not restored.model.embed_tokens
    ids = torch.arange(12) * 11 % 512
    assert torch.equal(quantized(ids, torch.arange(12), quantized.new_cache(16)), restored(ids, torch.arange(12), restored.new_cache(16)))


def test_int8_weights_are_held_once_and_still_serialized(quantized):
    """The kernel's packed copy is the only copy of the int8 weights (a second one cost a 1.5B
    target's process 2.2 GB): no int8 buffer, ``qweight`` unpacks exactly, fused parts serialize
    their rows of the fused layer, and weight_bytes still counts every weight a step reads."""
    gen = torch.Generator().manual_seed(5)
    weights = torch.randint(-127, 128, (96, 64), dtype=torch.int8, generator=gen)
    layer = Int8Linear(weights, torch.rand(96, generator=gen) + 0.01, None)
    assert [b.untyped_storage().nbytes() for b in layer.buffers() if b.dtype == torch.int8] == [1]  # weight_extent
    assert torch.equal(layer.qweight, weights) and torch.equal(layer.state_dict()["qweight"], weights)
    parts = [Int8Linear(weights[:32], torch.ones(32), None), Int8Linear(weights[32:], torch.ones(64), None)]
    Int8Linear.concat(parts)
    assert torch.equal(parts[1].qweight, weights[32:]) and parts[1]._packed is None
    state = quantized_state(quantized)
    serialized = sum(v.numel() * v.element_size() for k, v in state.items() if k != "model.embed_tokens.weight")
    assert quantized.weight_bytes == serialized


def test_quantized_close_to_float(tmp_path):
    write_tiny_model(tmp_path, TINY_QWEN2, seed=4)
    ref = load_decoder(tmp_path)
    q = quantize_decoder(load_decoder(tmp_path))
    ids = torch.arange(16) * 7 % 512
    a, b = ref(ids, torch.arange(16), ref.new_cache(16)), q(ids, torch.arange(16), q.new_cache(16))
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean()
    assert agree >= 0.8


def test_fused_projections_are_bit_identical_to_separate_ones(tiny_dirs):
    """q|k|v and gate|up fused into one int8 kernel call each change no output bit."""
    fused = quantize_decoder(load_decoder(tiny_dirs["target"]))
    separate = quantize_decoder(load_decoder(tiny_dirs["target"]), fuse=False)
    assert all(layer.self_attn.fused_qkv is not None and layer.mlp.fused_gate_up is not None
               for layer in fused.model.layers)
    assert all(layer.self_attn.fused_qkv is None and layer.mlp.fused_gate_up is None
               for layer in separate.model.layers)
    ids = torch.arange(3, 40) * 13 % 256
    a, b = fused.new_cache(48), separate.new_cache(48)
    assert torch.equal(fused(ids[:-2], torch.arange(35), a), separate(ids[:-2], torch.arange(35), b))
    assert torch.equal(fused(ids[-2:], torch.arange(35, 37), a), separate(ids[-2:], torch.arange(35, 37), b))


def test_int4_draft_keeps_output_exact(tiny_dirs):
    """An int4 draft (sizes of 64: one partial 4-bit block per row) for an int8 target, with and
    without a reduced draft vocabulary (a view of the int8 head's first rows)."""
    import specdec

    target = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="int8")
    draft = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="int4")
    assert draft.backend.dtype_name == "int4"
    params = specdec.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for vocab in (0, 256):
        spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=3, draft_vocab_size=vocab)
        for prompt in ([1, 2, 3], [7, 7, 7, 7, 40], list(range(60, 90))):
            plain = specdec.generate(target, prompt, params)
            spec_out = specdec.generate(target, prompt, params, draft=draft, spec=spec)
            assert spec_out.token_ids == plain.token_ids
            assert spec_out.stats.accepted_tokens > 0  # the same weights at 4 bits mostly agree


def test_int4_refuses_layer_sizes_it_cannot_run(tmp_path):
    import specdec
    from specdec.errors import SpecdecError
    from tests.conftest import make_tiny_model_dir
    from tests.model_fixtures import TINY_LLAMA

    path = make_tiny_model_dir(tmp_path / "llama", TINY_LLAMA)  # hidden 96: not a multiple of 64
    with pytest.raises(SpecdecError, match="multiples of 64.*--quantize int8"):
        specdec.load_model(path, dtype="float32", device="cpu", quantize="int4")


def test_a_loaded_int8_model_is_packed_before_its_first_forward(quantized, tmp_path):
    """The loader fuses q|k|v and gate|up from the int8 rows it read and prepacks every layer once
    (fused ones included) before returning: nothing is left to pack in a request's first forward."""
    from safetensors.torch import load_file, save_file

    from specdec.models.transformer import Decoder

    save_file(quantized_state(quantized), str(tmp_path / "q.safetensors"))
    with torch.device("meta"):
        skeleton = Decoder(quantized.config)
    restored = load_quantized_state(skeleton, load_file(str(tmp_path / "q.safetensors")))
    layers = [m for m in restored.modules() if isinstance(m, Int8Linear)]
    fused = [m for block in restored.modules() for m in (getattr(block, "fused_qkv", None), getattr(block, "fused_gate_up", None))
             if isinstance(m, Int8Linear)]
    assert len(fused) == 2 * quantized.config.num_layers
    assert all(m._packed is not None and m._unpacked is None for m in fused)
    assert all(m._unpacked is None and (m._packed is not None or m._rows_in is not None) for m in layers)
