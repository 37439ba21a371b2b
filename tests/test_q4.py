"""int4 target path (4-bit weights × int8 activations, kernels/q4.py): accuracy, the GGUF Q4_K
weights reproduced exactly, and bit-identical logits alone vs inside a verification chunk."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from specdec.kernels.build import kernel
from tests.model_fixtures import require_cpu_kernels
from specdec.kernels.q4 import Q4Linear

require_cpu_kernels()


# 320 / 704: whole blocks (interleaved codes) and a partial one of 2 / 6 groups (Q4_K's pair layout)
@pytest.mark.parametrize("width", [512, 320, 704])
def test_q4_linear_close_to_its_weights_and_to_float(width):
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, width, generator=gen) * 0.02, torch.randn(96, generator=gen)
    x = torch.randn(5, width, generator=gen)
    layer = Q4Linear.from_float(weight, bias)
    out = layer(x)
    exact = torch.nn.functional.linear(x, layer.dequantized(), bias)
    # stated bounds: per-token int8 activations cost ≤ 2% per row; 4-bit weights ≤ 12% vs float
    assert ((out - exact).norm(dim=-1) / exact.norm(dim=-1)).max() < 0.02
    ref = torch.nn.functional.linear(x, weight, bias)
    assert ((out - ref).norm(dim=-1) / ref.norm(dim=-1)).max() < 0.12


@pytest.mark.parametrize("rows", [2, 4, 5, 8, 9, 17])  # passes of ≤ 4 rows, tiles of 8
@pytest.mark.parametrize("kind", ["q4", "q8"])
@pytest.mark.parametrize("width", [768, 896])  # 896: a partial last block of 4 groups (the 0.5B draft's size)
def test_rows_bit_identical_alone_and_in_a_chunk(rows, kind, width):
    """The kernels tile rows by 8: every tile size and remainder must give a row the same bits."""
    from specdec.kernels.q4 import Q8Linear

    gen = torch.Generator().manual_seed(rows)
    layer = (Q4Linear if kind == "q4" else Q8Linear).from_float(torch.randn(40, width, generator=gen) * 0.05)
    x = torch.randn(rows, width, generator=gen)
    x[1] *= 50  # an outlier row must not change its neighbours (per-token scales)
    chunk = layer(x)
    for i in range(rows):
        assert torch.equal(chunk[i], layer(x[i : i + 1])[0]), f"row {i} of {rows}"


def test_q8_linear_close_to_float():
    from specdec.kernels.q4 import Q8Linear

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
    ref = torch.from_numpy(np.asarray(ref, dtype=np.float32))
    assert torch.equal(layer.dequantized(), ref)
    x = torch.randn(3, blocks * 256, generator=torch.Generator().manual_seed(1))
    exact = torch.nn.functional.linear(x, ref)  # the kernel on the file's own layout: int8 activations only
    assert ((layer(x) - exact).norm(dim=-1) / exact.norm(dim=-1)).max() < 0.02


def test_input_size_must_be_whole_group_pairs():
    from specdec.errors import SpecdecError

    with pytest.raises(SpecdecError, match="divisible by 64"):
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
    from specdec.kernels.q4 import Q8Linear

    decoder = q4_target.backend.decoder
    assert q4_target.backend.dtype_name == "int4"
    assert isinstance(decoder.model.layers[0].mlp.down_proj, Q4Linear)
    assert isinstance(decoder.lm_head, Q8Linear)  # logits keep 8 bits
    assert decoder.model.layers[0].self_attn.fused_qkv is not None


@pytest.mark.parametrize("k", [1, 3, 6, 9])
def test_int4_chunk_logits_bit_identical_to_single_tokens(q4_target, k):
    from tests.model_fixtures import assert_chunk_equals_single_tokens

    assert_chunk_equals_single_tokens(q4_target.backend.decoder, k)


@pytest.mark.parametrize("method", ["draft_model", "ngram", "suffix"])
def test_int4_greedy_speculation_equals_plain(q4_dirs, q4_target, method):
    import specdec

    draft = specdec.load_model(q4_dirs["draft"], dtype="float32", device="cpu", quantize="int4-all") \
        if method == "draft_model" else None
    if draft is not None:  # a draft with every layer in 4 bits, the head too: drafts cheaper, output unchanged
        assert isinstance(draft.backend.decoder.lm_head, Q4Linear)
    params = specdec.SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    spec = specdec.SpecConfig(method=method, num_speculative_tokens=4)
    for prompt in ([1, 2, 3], [7, 7, 7, 7, 40, 7, 7, 7], list(range(60, 90)) * 2):
        plain = specdec.generate(q4_target, prompt, params)
        assert specdec.generate(q4_target, prompt, params, draft=draft, spec=spec).token_ids == plain.token_ids


def test_int4_state_round_trip(q4_target, tmp_path):
    """The cached conversion (weights.py) restores the same layers and bit-identical logits."""
    from safetensors.torch import load_file, save_file

    from specdec.kernels.convert import load_quantized_state, quantized_state
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


def _forward(decoder, ids, cache, mask=None, python_layers=False):
    runner = decoder.layer_runner
    if python_layers:  # the modules' own forwards: the reference for the C++ glue
        decoder.set_layer_runner(None)
    try:
        positions = torch.arange(cache.seq_len, cache.seq_len + len(ids))
        return decoder(torch.tensor(ids), positions, cache, attn_mask=mask)
    finally:
        decoder.set_layer_runner(runner)


def test_rms_norm_op_matches_torch():
    ops = kernel()
    gen = torch.Generator().manual_seed(5)
    x, residual, weight = torch.randn(3, 96, generator=gen), torch.randn(3, 96, generator=gen), torch.randn(96, generator=gen)
    expected_stream = x + residual
    out = ops.rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(x, expected_stream)  # the residual is added in place
    torch.testing.assert_close(out, torch.rms_norm(expected_stream, (96,), weight, 1e-6), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ops.rms_norm(x, None, weight, 1e-6), out, rtol=0, atol=0)


# head sizes 16 / 64 / 80 / 128 cover both value-accumulation widths; start 70 spans two key blocks;
# 70 tokens span three token tiles
@pytest.mark.parametrize("start,tokens,dim", [(0, 7, 16), (11, 1, 64), (11, 4, 80), (70, 3, 128), (5, 70, 64)])
def test_attention_op_matches_the_python_attention(start, tokens, dim):
    """RoPE + cache write + grouped-query causal attention, against the float reference math."""
    from specdec.models.transformer import apply_rope, causal_mask, rope_tables

    heads, kv_heads = 6, 2
    gen = torch.Generator().manual_seed(start + tokens)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen)
    k_cache, v_cache = torch.randn(2, kv_heads, 96, dim, generator=gen).unbind(0)
    k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    cos, sin = rope_tables(dim, 96, 10_000.0)
    cos, sin = cos[start : start + tokens].contiguous(), sin[start : start + tokens].contiguous()
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    out = kernel().attention(qkv, cos, sin, k_cache, v_cache, start, heads, kv_heads, None)

    split = qkv.reshape(tokens, heads + 2 * kv_heads, dim).transpose(0, 1)
    q = apply_rope(split[:heads], cos, sin)
    ref_k[:, start : start + tokens] = apply_rope(split[heads : heads + kv_heads], cos, sin)
    ref_v[:, start : start + tokens] = split[heads + kv_heads :]
    end = start + tokens
    keys = ref_k[:, :end].repeat_interleave(heads // kv_heads, dim=0)
    values = ref_v[:, :end].repeat_interleave(heads // kv_heads, dim=0)
    scores = (q @ keys.transpose(1, 2)) * dim**-0.5
    scores = scores.masked_fill(~causal_mask(tokens, start, torch.device("cpu")), float("-inf"))
    expected = (torch.softmax(scores, -1) @ values).transpose(0, 1).reshape(tokens, heads * dim)
    torch.testing.assert_close(k_cache, ref_k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_cache, ref_v, rtol=0, atol=0)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_layer_ops_path_agrees_with_the_module_forwards(q4_target):
    """End to end, the C++ glue and the Python modules differ only by float rounding — which int8
    activation rounding can occasionally amplify, so compare what decoding uses: the argmax."""
    decoder = q4_target.backend.decoder
    assert decoder.layer_runner is not None
    ids = list(range(3, 43))
    ours = _forward(decoder, ids, decoder.new_cache(64))
    reference = _forward(decoder, ids, decoder.new_cache(64), python_layers=True)
    assert (ours.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9
    torch.testing.assert_close(ours[:8], reference[:8], rtol=1e-4, atol=1e-4)


def test_layer_ops_tree_mask(q4_target):
    """With a tree mask every row sees exactly its marked slots: a node gets the very bits it gets
    when its root-to-node path is decoded one token at a time (siblings invisible to each other)."""
    decoder = q4_target.backend.decoder
    prefix = list(range(20, 40))
    # tree: slot 0 = root (token 5), slots 1 and 2 are its children (tokens 6 and 8)
    mask = torch.ones(3, len(prefix) + 3, dtype=torch.bool)
    mask[0, -2:] = False
    mask[1, -1] = False
    mask[2, -2] = False
    cache = decoder.new_cache(64)
    _forward(decoder, prefix, cache)
    positions = torch.tensor([len(prefix), len(prefix) + 1, len(prefix) + 1])
    tree = decoder(torch.tensor([5, 6, 8]), positions, cache, attn_mask=mask)
    for node, token in ((1, 6), (2, 8)):
        path = decoder.new_cache(64)
        _forward(decoder, prefix, path)
        assert torch.equal(tree[0], _forward(decoder, [5], path)[0])
        assert torch.equal(tree[node], _forward(decoder, [token], path)[0])
