"""The C++ layer loop (kernels/layer_stack.cpp) gives the very bits of the Python loop it replaces
(CppLayers' plan, the same kernel calls one by one from Python): prefill, verification chunks, single
tokens, tree masks and ragged batches of requests, fused and unfused projections — so plain and
speculative decoding are unchanged by it, only faster."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.kernels.int8 import int8_kernel
from specdec.kernels.layers import CppLayers
from specdec.models.transformer import RaggedInput


@pytest.fixture(scope="module", params=["int4", "int4-all", "int8"])
def int4_decoder(request, tiny_dirs, int4_kernel):
    """Each mode whose layers are the extension's kernels: int8 where it runs the VNNI kernel."""
    if request.param == "int8" and int8_kernel() != "vnni":
        pytest.skip("int8 runs fbgemm on this CPU: its layers stay in the Python loop")
    model = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize=request.param)
    decoder = model.backend.decoder
    assert isinstance(decoder.layer_runner, CppLayers) and decoder.layer_runner.stack is not None
    return decoder


def _run(decoder: torch.nn.Module, use_stack: bool, fn):
    """``fn()`` with the C++ loop (``use_stack``) or CppLayers' Python loop over the same kernels."""
    runner = decoder.layer_runner
    stack = runner.stack
    if not use_stack:
        runner.stack = None
    try:
        return fn()
    finally:
        runner.stack = stack


def _steps(decoder):
    """A prefill of 9 tokens, a chunk of 3, a single token and a 3-node tree (root, two siblings):
    every kind of forward a decode takes; returns every logit row and the cache."""
    ids = torch.arange(16) * 37 % 512
    cache = decoder.new_cache(32)
    outs = [decoder(ids[a:b], torch.arange(a, b), cache) for a, b in ((0, 9), (9, 12), (12, 13))]
    mask = torch.ones(3, cache.seq_len + 3, dtype=torch.bool)
    mask[1, -1] = False  # siblings 1 and 2 see the root, not each other
    mask[2, -2] = False
    mask[0, -2:] = False
    outs.append(decoder(ids[13:16], torch.tensor([13, 14, 14]), cache, attn_mask=mask))
    return torch.cat(outs), cache


def test_the_cpp_loop_gives_the_python_loops_bits(int4_decoder):
    stack_logits, stack_cache = _run(int4_decoder, True, lambda: _steps(int4_decoder))
    loop_logits, loop_cache = _run(int4_decoder, False, lambda: _steps(int4_decoder))
    assert torch.equal(stack_logits, loop_logits)
    assert torch.equal(stack_cache.k, loop_cache.k) and torch.equal(stack_cache.v, loop_cache.v)
    assert stack_cache.seq_len == loop_cache.seq_len == 16


def test_the_cpp_loop_batches_ragged_requests_with_the_same_bits(int4_decoder):
    gen = torch.Generator().manual_seed(7)
    histories = [torch.randint(0, 512, (n,), generator=gen) for n in (5, 20, 11)]
    new = [torch.randint(0, 512, (n,), generator=gen) for n in (1, 4, 2)]

    def batch():
        caches, inputs = [], []
        for history, tokens in zip(histories, new):
            cache = int4_decoder.new_cache(48)
            int4_decoder(history, torch.arange(len(history)), cache)
            caches.append(cache)
            inputs.append(RaggedInput(tokens, torch.arange(len(history), len(history) + len(tokens)), cache))
        return int4_decoder.forward_ragged(inputs), caches

    stack_logits, stack_caches = _run(int4_decoder, True, batch)
    loop_logits, loop_caches = _run(int4_decoder, False, batch)
    for ours, theirs in zip(stack_logits, loop_logits):
        assert torch.equal(ours, theirs)
    for ours, theirs in zip(stack_caches, loop_caches):
        assert torch.equal(ours.k, theirs.k)


def test_unfused_projections_run_as_parts_with_the_same_bits(tiny_dirs, int4_kernel):
    """Projections that were not fused (q, k, v apart) are called one by one and concatenated."""
    model = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="int4")
    decoder = model.backend.decoder
    fused_logits, _ = _steps(decoder)
    for layer in decoder.model.layers:
        layer.self_attn.set_fused_projections(None)
        layer.mlp.set_fused_projections(None)
    runner = CppLayers(decoder)
    assert runner.stack is not None
    decoder.set_layer_runner(runner, runner.ragged)
    unfused_logits, _ = _run(decoder, True, lambda: _steps(decoder))
    assert torch.equal(unfused_logits, fused_logits)


def test_fbgemm_int8_layers_keep_the_python_loop(tiny_dirs, monkeypatch):
    """fbgemm's int8 layers are not the extension's: no C++ stack, the Python loop runs them."""
    monkeypatch.setenv("SPECDEC_INT8_KERNEL", "fbgemm")
    int8_kernel.cache_clear()
    try:
        model = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize="int8")
    finally:
        monkeypatch.delenv("SPECDEC_INT8_KERNEL")
        int8_kernel.cache_clear()
    runner = model.backend.decoder.layer_runner
    if runner is not None:
        assert runner.stack is None


def test_a_bad_linear_spec_is_refused_clearly(int4_kernel):
    stack = int4_kernel.LayerStack(1e-6)
    norm = torch.ones(64)
    good = ("q8", [torch.zeros(64, 64, dtype=torch.int8), torch.ones(64)], None)
    with pytest.raises(RuntimeError, match="unknown linear format q5"):
        stack.add_layer(norm, [("q5", [], None)], 1, 1, good, norm, [good], good)
    with pytest.raises(RuntimeError, match="q4 takes 5 tensors, got 2"):
        stack.add_layer(norm, [("q4", good[1], None)], 1, 1, good, norm, [good], good)
    assert len(stack) == 0
    stack.add_layer(norm, [good], 1, 1, good, norm, [good], good)
    with pytest.raises(RuntimeError, match="layer 3 out of range"):
        stack.run(torch.zeros(1, 64), [], [3])


@pytest.mark.parametrize("use_stack", [True, False], ids=["cpp", "python"])
def test_a_long_prompts_mlp_in_row_passes_gives_each_rows_bits(int4_decoder, use_stack):
    """A prompt pass longer than the MLP's row pass (kMlpRows / MLP_ROWS = 256: 300 rows run as 256 + 44)
    gives every row the bits of passes too short to be split (150 + 150), cache included."""
    from specdec.kernels.layers import MLP_ROWS

    ids = torch.arange(300) * 37 % 512
    assert ids.numel() > MLP_ROWS > ids.numel() // 2

    def passes(cuts):
        cache = int4_decoder.new_cache(320)
        logits = [int4_decoder(ids[a:b], torch.arange(a, b), cache, num_logits=b - a) for a, b in cuts]
        return torch.cat(logits), cache

    whole, whole_cache = _run(int4_decoder, use_stack, lambda: passes([(0, 300)]))
    halves, halves_cache = _run(int4_decoder, use_stack, lambda: passes([(0, 150), (150, 300)]))
    assert torch.equal(whole, halves)
    assert torch.equal(whole_cache.k, halves_cache.k) and torch.equal(whole_cache.v, halves_cache.v)
