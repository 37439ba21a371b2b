"""Decoder.forward_ragged: several requests (a prefill chunk, single decode tokens, a draft to verify,
each with its own cache and length) in one forward; each request's logits and cache bit-identical
to running it alone — the batch invariance continuous batching needs (issue 24)."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.models.transformer import RaggedInput


@pytest.fixture(scope="module", params=["int8", "int4"])
def quantized(request, tiny_dirs, int4_kernel):
    model = specdec.load_model(tiny_dirs["target"], dtype="float32", device="cpu", quantize=request.param)
    decoder = model.backend.decoder
    assert decoder.ragged_layer_runner is not None  # the C++ layers batch; else this test proves nothing
    return decoder


def _prefilled(decoder, ids: torch.Tensor, capacity: int = 96):
    cache = decoder.new_cache(capacity)
    if len(ids):
        decoder(ids, torch.arange(len(ids)), cache)
    return cache


def test_each_request_in_a_ragged_batch_equals_itself_alone(quantized):
    gen = torch.Generator().manual_seed(3)
    histories = [torch.randint(0, 512, (n,), generator=gen) for n in (0, 7, 30, 12, 51)]
    # new tokens per request: a prefill (empty history), one decode token, a 5-token draft, one token, a 3-token draft
    new = [torch.randint(0, 512, (n,), generator=gen) for n in (9, 1, 5, 1, 3)]
    num_logits = [1, None, None, None, None]  # a prefill needs only its last row
    alone, batched_caches, inputs = [], [], []
    for history, tokens, keep in zip(histories, new, num_logits):
        cache = _prefilled(quantized, history)
        positions = torch.arange(len(history), len(history) + len(tokens))
        alone.append((quantized(tokens, positions, cache, num_logits=keep), cache))
        batched = _prefilled(quantized, history)
        batched_caches.append(batched)
        inputs.append(RaggedInput(tokens, positions, batched, num_logits=keep))
    outputs = quantized.forward_ragged(inputs)
    for (logits, cache), out, batched in zip(alone, outputs, batched_caches):
        assert torch.equal(out, logits)
        assert batched.seq_len == cache.seq_len
        assert torch.equal(batched.k[:, :, :cache.seq_len], cache.k[:, :, :cache.seq_len])
        assert torch.equal(batched.v[:, :, :cache.seq_len], cache.v[:, :, :cache.seq_len])


def test_greedy_decoding_of_several_requests_stepped_together_equals_each_alone(quantized):
    """Eight requests decoded 12 greedy steps in lock step through forward_ragged produce the
    tokens each produces alone."""
    prompts = [torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n)) for n in range(3, 11)]

    def alone(prompt: torch.Tensor) -> list[int]:
        cache, out = quantized.new_cache(64), []
        logits = quantized(prompt, torch.arange(len(prompt)), cache, num_logits=1)
        for step in range(12):
            out.append(int(logits[-1].argmax()))
            logits = quantized(torch.tensor([out[-1]]), torch.tensor([len(prompt) + step]), cache)
        return out

    caches = [quantized.new_cache(64) for _ in prompts]
    logits = quantized.forward_ragged([RaggedInput(p, torch.arange(len(p)), c, num_logits=1) for p, c in zip(prompts, caches)])
    together: list[list[int]] = [[] for _ in prompts]
    for step in range(12):
        for tokens, row in zip(together, logits):
            tokens.append(int(row[-1].argmax()))
        logits = quantized.forward_ragged([RaggedInput(torch.tensor([t[-1]]), torch.tensor([len(p) + step]), c)
                                           for t, p, c in zip(together, prompts, caches)])
    assert together == [alone(p) for p in prompts]


def test_float_weights_run_the_requests_one_by_one(tiny_target):
    decoder = tiny_target.backend.decoder
    assert decoder.ragged_layer_runner is None
    cache_a, cache_b = decoder.new_cache(16), decoder.new_cache(16)
    ids = torch.tensor([5, 6, 7])
    out = decoder.forward_ragged([RaggedInput(ids, torch.arange(3), cache_a), RaggedInput(ids[:1], torch.arange(1), cache_b)])
    assert torch.equal(out[0], decoder(ids, torch.arange(3), decoder.new_cache(16)))
    assert [o.shape[0] for o in out] == [3, 1] and (cache_a.seq_len, cache_b.seq_len) == (3, 1)
