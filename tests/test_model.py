"""Our decoder against transformers' implementation of the same weights (the reference)."""

from __future__ import annotations

import pytest
import torch

from specdec.errors import WeightsError
from specdec.models.weights import load_decoder
from tests.model_fixtures import TINY_LLAMA, TINY_QWEN2, make_hf_model, write_tiny_model

CONFIGS = {"qwen2": TINY_QWEN2, "llama": TINY_LLAMA}


@pytest.fixture(params=sorted(CONFIGS))
def pair(request, tmp_path):
    """(transformers model, our decoder) with identical weights."""
    config = CONFIGS[request.param]
    write_tiny_model(tmp_path, config, seed=3)
    return make_hf_model(config, seed=3), load_decoder(tmp_path)


def test_prefill_logits_match_transformers(pair):
    hf, ours = pair
    ids = torch.randint(0, 512, (1, 23), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(ids).logits[0]
    cache = ours.new_cache(64)
    got = ours(ids[0], torch.arange(23), cache)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert cache.seq_len == 23


def test_decode_with_cache_matches_full_forward(pair):
    """Token-by-token decoding through the KV cache gives the same logits as one full pass."""
    hf, ours = pair
    ids = torch.randint(0, 512, (1, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits[0]
    cache = ours.new_cache(32)
    ours(ids[0, :5], torch.arange(5), cache)
    for pos in range(5, 17):
        logits = ours(ids[0, pos : pos + 1], torch.tensor([pos]), cache)
        torch.testing.assert_close(logits[0], expected[pos], atol=1e-4, rtol=1e-4)


def test_chunked_forward_matches_single_tokens(pair):
    """A verification chunk of k tokens scores each like decoding it alone, to fp32 tolerance: the GEMM
    kernels for M=1 and M=k round differently (bit-identity is the int8 path's job)."""
    _, ours = pair
    ids = torch.randint(0, 512, (12,), generator=torch.Generator().manual_seed(2))
    cache_a, cache_b = ours.new_cache(16), ours.new_cache(16)
    ours(ids[:7], torch.arange(7), cache_a)
    ours(ids[:7], torch.arange(7), cache_b)
    chunk = ours(ids[7:], torch.arange(7, 12), cache_a)
    for i, pos in enumerate(range(7, 12)):
        single = ours(ids[pos : pos + 1], torch.tensor([pos]), cache_b)
        torch.testing.assert_close(chunk[i], single[0], atol=1e-4, rtol=1e-4)


def test_truncate_then_decode_equals_fresh_run(pair):
    _, ours = pair
    ids = torch.randint(0, 512, (10,), generator=torch.Generator().manual_seed(4))
    junk = torch.randint(0, 512, (4,), generator=torch.Generator().manual_seed(5))
    cache = ours.new_cache(32)
    ours(ids[:6], torch.arange(6), cache)
    ours(junk, torch.arange(6, 10), cache)  # a rejected draft
    cache.truncate(6)
    rolled_back = ours(ids[6:], torch.arange(6, 10), cache)
    fresh_cache = ours.new_cache(32)
    fresh = ours(ids, torch.arange(10), fresh_cache)[6:]
    torch.testing.assert_close(rolled_back, fresh, atol=1e-4, rtol=1e-4)
    assert cache.seq_len == fresh_cache.seq_len == 10


def test_num_logits_and_hidden(pair):
    _, ours = pair
    ids = torch.arange(9)
    full = ours(ids, torch.arange(9), ours.new_cache(16))
    last, hidden = ours(ids, torch.arange(9), ours.new_cache(16), num_logits=1, return_hidden=True)
    torch.testing.assert_close(last[0], full[-1])
    assert hidden.shape == (1, ours.config.hidden_size)


def test_cache_overflow_is_a_clear_error(pair):
    _, ours = pair
    cache = ours.new_cache(4)
    with pytest.raises(Exception, match="KV cache full"):
        ours(torch.arange(5), torch.arange(5), cache)


def test_missing_weights_dir_is_clear(tmp_path):
    with pytest.raises(WeightsError, match="config.json"):
        load_decoder(tmp_path)


def test_corrupt_safetensors_is_clear(tmp_path):
    write_tiny_model(tmp_path)
    blob = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(WeightsError, match="corrupt or truncated"):
        load_decoder(tmp_path)


@pytest.mark.parametrize("change,words", [
    ({"num_hidden_layers": 0}, "sizes must be >= 1: num_hidden_layers 0"),  # decoded garbage, exit 0
    ({"num_attention_heads": 0}, "sizes must be >= 1: num_attention_heads 0"),  # an IndexError in a kernel
    ({"num_hidden_layers": -3}, "num_hidden_layers -3"),
    ({"num_attention_heads": "nine"}, "not a valid model config: invalid literal"),
    ({"vocab_size": None}, "not a valid model config"),
    ({"rope_theta": "abc"}, "not a valid model config"),
    ({"num_hidden_layers": 1}, "layers up to 3 but the config says num_hidden_layers 1"),
])
def test_a_config_that_does_not_describe_the_weights_is_clear(tmp_path, change, words):
    """A config.json value of the wrong kind was a ValueError/TypeError traceback; one saying fewer layers than the
    weights hold dropped the rest silently."""
    import json

    write_tiny_model(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(WeightsError, match=words):
        load_decoder(tmp_path)


def test_a_config_that_is_not_an_object_is_clear(tmp_path):
    write_tiny_model(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(WeightsError, match="not a valid model config: a JSON list"):
        load_decoder(tmp_path)


def test_static_cache_steps_match_the_dynamic_path(pair):
    """The CUDA-graph form of a step (slots from a positions tensor, attention over the whole cache
    under a device-built mask, seq_len moved by the caller) computes the same logits and cache
    contents as the ordinary path; runs eagerly here, so CI checks the logic without a GPU."""
    _, ours = pair
    ids = torch.randint(0, 512, (15,), generator=torch.Generator().manual_seed(4))
    dynamic, static = ours.new_cache(40), ours.new_cache(40)
    expected = [ours(ids[:9], torch.arange(9), dynamic)]
    got = [ours(ids[:9], torch.arange(9), static)]  # prefill stays dynamic in the graph runner too
    for start, end in [(9, 10), (10, 14), (14, 15)]:
        positions = torch.arange(start, end)
        expected.append(ours(ids[start:end], positions, dynamic))
        got.append(ours(ids[start:end], positions, static, static_cache=True))
        assert static.seq_len == start  # the caller advances
        static.advance(end - start)
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(static.k[:, :, :15], dynamic.k[:, :, :15])
    torch.testing.assert_close(static.v[:, :, :15], dynamic.v[:, :, :15])


def test_static_cache_steps_record_features_as_the_dynamic_path(pair):
    """An EAGLE/Medusa request's target steps replay graphs too: a static step writes each row's
    final hidden state at its slot (the slots tensor), as a dynamic step writes it at seq_len."""
    _, ours = pair
    hidden = ours.config.hidden_size
    ids = torch.randint(0, 512, (14,), generator=torch.Generator().manual_seed(6))
    dynamic, static = ours.new_cache(40), ours.new_cache(40)
    for cache in (dynamic, static):
        cache.record_features(hidden)
        ours(ids[:9], torch.arange(9), cache)
    for start, end in [(9, 10), (10, 14)]:
        ours(ids[start:end], torch.arange(start, end), dynamic)
        ours(ids[start:end], torch.arange(start, end), static, static_cache=True)
        static.advance(end - start)
    assert static.features[9:14].abs().sum() > 0
    torch.testing.assert_close(static.features[:14], dynamic.features[:14], atol=1e-4, rtol=1e-4)


def test_static_cache_tree_steps_match_the_dynamic_path(pair):
    """The CUDA-graph form of a tree step (nodes at shared positions written to their own slots,
    attention over the whole cache under a [T, capacity] ancestor mask, as the graph runner fills its
    buffers) gives every node the logits and cache entries of the ordinary tree forward."""
    from specdec.tree import TreeLayout

    _, ours = pair
    gen = torch.Generator().manual_seed(5)
    context = torch.randint(0, 512, (10,), generator=gen)
    nodes = torch.randint(0, 512, (6,), generator=gen)
    dynamic, static = ours.new_cache(40), ours.new_cache(40)
    ours(context, torch.arange(10), dynamic)
    ours(context, torch.arange(10), static)
    tree = TreeLayout(10, [-1, -1, 0, 0, 1, 2])
    positions, mask = tree.positions(6), tree.mask(6)
    expected = ours(nodes, positions, dynamic, mask)
    capacity_mask = torch.zeros(6, static.k.shape[2], dtype=torch.bool)
    capacity_mask[:, : mask.shape[1]] = mask
    got = ours(nodes, positions, static, capacity_mask, static_cache=True, slots=torch.arange(10, 16))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(static.k[:, :, :16], dynamic.k[:, :, :16])

def test_graph_runner_pools_cache_storage(pair):
    """The CUDA-graph runner's cache pool (CPU-checkable: recording itself needs a GPU): capacities
    round up to SLOT_ROUNDING, a dead cache's storage goes to the next request of that capacity — the
    graphs recorded on it stay valid — and only pooled caches with whole-model chunks are routed to graphs."""
    import gc

    from specdec.backends.cuda_graphs import MAX_GRAPH_TOKENS, SLOT_ROUNDING, CudaGraphRunner

    _, ours = pair
    runner = CudaGraphRunner(ours)
    cache = runner.new_cache(SLOT_ROUNDING + 1)
    assert cache.max_seq_len == SLOT_ROUNDING + 1 and cache.k.shape[2] == 2 * SLOT_ROUNDING
    storage = cache.k.data_ptr()
    other = runner.new_cache(2 * SLOT_ROUNDING)  # same capacity while the first is alive: new storage
    assert other.k.data_ptr() != storage
    assert runner.can_run(cache, 1, None, False, None) and runner.can_run(cache, MAX_GRAPH_TOKENS, None, False, None)
    assert not runner.can_run(cache, MAX_GRAPH_TOKENS + 1, None, False, None)  # prefill: eager
    assert not runner.can_run(cache, 1, [0, 1], False, None)  # layer subsets: eager
    assert not runner.can_run(cache, 1, None, True, None)
    assert not runner.can_run(cache, 1, None, False, 100)  # a reduced draft vocabulary: eager
    assert not runner.can_run(ours.new_cache(16), 1, None, False, None)  # not from the pool
    cache.record_features(ours.config.hidden_size)  # a feature drafter's request: routed to graphs too
    assert runner.can_run(cache, 1, None, False, None)
    features = cache.features.data_ptr()
    del cache
    gc.collect()
    again = runner.new_cache(2 * SLOT_ROUNDING - 5)
    assert again.k.data_ptr() == storage and again.seq_len == 0 and again.max_seq_len == 2 * SLOT_ROUNDING - 5
    assert again.features is None  # a request that does not ask keeps none
    again.record_features(ours.config.hidden_size)
    assert again.features.data_ptr() == features  # the storage's own buffer: the address its graphs wrote to
    assert runner.new_cache(10).k.shape[2] == SLOT_ROUNDING


def test_a_meta_skeleton_does_no_arithmetic():
    """A cached model is rebuilt on a skeleton made on the meta device; any arithmetic there (an
    embedding's random init, the RoPE tables) runs Python meta functions that import torch._dynamo —
    ~1 s of every start measured, for values the loaded weights replace."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from specdec.models.config import ModelConfig\n"
        "from specdec.models.transformer import Decoder\n"
        f"cfg = ModelConfig.from_hf_dict({TINY_QWEN2!r})\n"
        "with torch.device('meta'):\n"
        "    model = Decoder(cfg)\n"
        "assert model.rope_cos.is_meta and model.model.embed_tokens.weight.is_meta\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_a_random_model_still_gets_random_embeddings():
    torch.manual_seed(0)
    from specdec.models.config import ModelConfig
    from specdec.models.transformer import Decoder

    model = Decoder(ModelConfig.from_hf_dict(TINY_QWEN2))
    weight = model.model.embed_tokens.weight
    assert weight.std().item() == pytest.approx(1.0, abs=0.1) and torch.isfinite(model.rope_cos).all()


def test_buffers_older_checkpoints_save_inside_the_layers_are_dropped(tmp_path):
    """The 'layers beyond the config' check counted model.layers.0.self_attn.rotary_emb.inv_freq (older Llama files)."""
    from safetensors.torch import load_file, save_file

    write_tiny_model(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    save_file(state, tmp_path / "model.safetensors")
    assert load_decoder(tmp_path) is not None
