"""Automatic prefix caching (specdec/prefix_cache.py): a request starts from the keys/values an
earlier prompt computed for the same leading tokens — bit-identical to computing them again where
rows are computed independently (int8/int4), refused where they are not (float modes)."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.errors import SpecdecError
from specdec.models.kv_cache import KVCache
from specdec.prefix_cache import PrefixCache
from specdec.sampling import SamplingParams


def filled_cache(tokens: list[int], capacity: int = 64) -> KVCache:
    """A cache whose slot i holds a value derived from the tokens up to i (a stand-in for a prompt pass)."""
    cache = KVCache(2, 1, 4, capacity)
    for slot in range(len(tokens)):
        value = float(sum(tokens[: slot + 1]))
        cache.k[:, :, slot] = value
        cache.v[:, :, slot] = -value
    cache.advance(len(tokens))
    return cache


def block_bytes(block_size: int) -> int:
    return 2 * 2 * 1 * block_size * 4 * 4  # keys and values, [2 layers, 1 head, block, 4 dims] float32


def test_restore_copies_the_longest_run_of_whole_blocks_and_never_the_last_token():
    cache = PrefixCache(max_bytes=10**6, block_size=4)
    first = list(range(1, 11))  # 10 tokens: two whole blocks stored
    cache.store(filled_cache(first), first)
    assert len(cache) == 2

    fresh = KVCache(2, 1, 4, 64)
    assert cache.restore(fresh, first + [99, 98]) == 8
    assert fresh.seq_len == 8
    assert torch.equal(fresh.k[:, :, :8], filled_cache(first).k[:, :, :8])
    assert torch.equal(fresh.v[:, :, :8], filled_cache(first).v[:, :, :8])
    # the same 8 tokens as a whole prompt: the last one must be computed (its logits are needed)
    assert cache.restore(KVCache(2, 1, 4, 64), first[:8]) == 4
    # a different token inside block 2: only block 1 matches (keys are exact tokens, not hashes)
    assert cache.restore(KVCache(2, 1, 4, 64), first[:5] + [0] + first[6:]) == 4
    # a different first token: nothing
    assert cache.restore(KVCache(2, 1, 4, 64), [0] + first[1:]) == 0
    assert cache.hit_tokens == 16 and cache.queried_tokens == 12 + 8 + 10 + 10
    with pytest.raises(ValueError, match="empty cache"):
        cache.restore(filled_cache([1, 2]), first)


def test_a_block_belongs_to_its_whole_prefix():
    """The same block of tokens after different beginnings is two entries: its keys/values depend
    on everything before it."""
    cache = PrefixCache(max_bytes=10**6, block_size=2)
    a, b = [1, 2, 7, 8, 9], [3, 4, 7, 8, 9]
    cache.store(filled_cache(a), a)
    cache.store(filled_cache(b), b)
    assert len(cache) == 4
    fresh = KVCache(2, 1, 4, 64)
    assert cache.restore(fresh, b) == 4
    assert torch.equal(fresh.k[:, :, :4], filled_cache(b).k[:, :, :4])


def test_eviction_keeps_the_budget_and_drops_ends_before_beginnings():
    cache = PrefixCache(max_bytes=3 * block_bytes(2), block_size=2)
    shared = [5, 6]
    one, two = shared + [1, 1, 1, 1], shared + [2, 2, 2, 2]
    cache.store(filled_cache(one), one)  # 3 blocks: the budget is full
    assert cache.nbytes == 3 * block_bytes(2)
    cache.store(filled_cache(two), two)  # 2 new blocks: 2 of the first prompt's blocks go
    assert cache.nbytes <= cache.max_bytes and len(cache) == 3
    # the shared first block survives (used by both), the first prompt's tail was evicted first
    assert cache.restore(KVCache(2, 1, 4, 64), one + [0]) == 2
    assert cache.restore(KVCache(2, 1, 4, 64), two + [0]) == 6
    # no block is left that no prompt can reach: each one's parent is cached
    ids = {block.entry_id for block in cache.blocks.values()}
    assert all(parent == -1 or parent in ids for parent, _ in cache.blocks)
    nothing = PrefixCache(max_bytes=0, block_size=2)
    nothing.store(filled_cache(one), one)
    assert len(nothing) == 0


def test_a_feature_cache_is_neither_restored_nor_stored():
    """EAGLE drafts from every prompt row's target features, which the prefix cache does not keep."""
    cache = PrefixCache(max_bytes=10**6, block_size=2)
    tokens = [1, 2, 3, 4, 5]
    with_features = filled_cache(tokens)
    with_features.record_features(8)
    cache.store(with_features, tokens)
    assert len(cache) == 0
    cache.store(filled_cache(tokens), tokens)
    wants_features = KVCache(2, 1, 4, 64)
    wants_features.record_features(8)
    assert cache.restore(wants_features, tokens) == 0 and wants_features.seq_len == 0


@pytest.fixture(scope="module", params=["int8", "int4", "int4+int8-prompts"])
def quantized_pair(request, tiny_dirs, int4_kernel):
    mode, _, prompts = request.param.partition("+")
    prompt_mode = "int8" if prompts else None
    target = specdec.load_model(tiny_dirs["target"], quantize=mode, prompt_quantize=prompt_mode)
    draft = specdec.load_model(tiny_dirs["draft"], quantize="int8")
    return target, draft


def test_restored_prefix_gives_bit_identical_logits(quantized_pair):
    """A prompt pass over the rest of a prompt after a restored prefix: the same logits (torch.equal)
    and cache contents as a prompt pass over the whole prompt."""
    target, _ = quantized_pair
    backend = target.backend
    cache = PrefixCache(max_bytes=10**8, block_size=8)
    gen = torch.Generator().manual_seed(3)
    earlier = torch.randint(0, 500, (29,), generator=gen).tolist()
    prompt = earlier[:21] + torch.randint(0, 500, (9,), generator=gen).tolist()
    state = backend.new_state(64)
    backend.prompt_backend.forward(state, earlier, num_logits=1)
    cache.store(state, earlier)

    cold = backend.new_state(64)
    cold_logits = backend.prompt_backend.forward(cold, prompt, num_logits=1)
    warm = backend.new_state(64)
    assert cache.restore(warm, prompt) == 16
    warm_logits = backend.prompt_backend.forward(warm, prompt[16:], num_logits=1)
    assert torch.equal(warm_logits, cold_logits)
    assert torch.equal(warm.k[:, :, :30], cold.k[:, :, :30]) and torch.equal(warm.v[:, :, :30], cold.v[:, :, :30])


CHAT = [  # a conversation re-sent with each turn, and two prompts sharing a preamble
    "You are a careful assistant. Answer in one line.\nQ: what is 2+2?",
    "You are a careful assistant. Answer in one line.\nQ: what is 2+2?\nA: 4\nQ: and 3+3?",
    "You are a careful assistant. Answer in one line.\nQ: name a colour.",
]


@pytest.mark.parametrize("method", [None, "draft_model", "suffix"])
def test_generation_with_the_prefix_cache_equals_generation_without(quantized_pair, method):
    target, draft = quantized_pair
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    spec = specdec.SpecConfig(method=method, num_speculative_tokens=3) if method else None
    use_draft = draft if method == "draft_model" else None
    cold = [specdec.generate(target, p, params, draft=use_draft, spec=spec) for p in CHAT]
    cache = specdec.enable_prefix_caching(target, gb=0.1, block_size=8)
    try:
        warm = [specdec.generate(target, p, params, draft=use_draft, spec=spec) for p in CHAT]
    finally:
        target.backend.prefix_cache = None
    assert [w.token_ids for w in warm] == [c.token_ids for c in cold]
    assert warm[0].stats.cached_prompt_tokens == 0
    assert warm[1].stats.cached_prompt_tokens >= 16 and warm[2].stats.cached_prompt_tokens >= 8
    assert cache.hit_tokens == sum(w.stats.cached_prompt_tokens for w in warm)


def test_batched_requests_with_the_prefix_cache_equal_each_alone(quantized_pair):
    """Under continuous batching with chunked prefill: a restored prefix shifts where the prompt's
    chunks start; every request's output is still its output alone."""
    target, draft = quantized_pair
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=3)
    alone = [specdec.generate(target, p, params).token_ids for p in CHAT]
    specdec.enable_prefix_caching(target, gb=0.1, block_size=8)
    try:
        specdec.generate(target, CHAT[0], params)  # the shared preamble is cached now
        outs = specdec.generate_batch(target, CHAT, params, draft=draft, spec=spec, max_num_seqs=3, prefill_chunk=4)
    finally:
        target.backend.prefix_cache = None
    assert [o.token_ids for o in outs] == alone
    assert all(o.stats.cached_prompt_tokens >= 8 for o in outs)


def test_a_budget_under_one_block_is_refused_and_eviction_is_counted(quantized_pair):
    """A budget that holds no block cached nothing, silently (every response said cached_tokens 0)."""
    target, _ = quantized_pair
    with pytest.raises(SpecdecError, match="holds no block"):
        specdec.enable_prefix_caching(target, gb=1e-9, block_size=8)
    state = target.backend.new_state(8)
    cache = specdec.enable_prefix_caching(target, gb=2 * 2 * state.k.numel() * state.k.element_size() / 1e9, block_size=8)
    try:
        for start in range(3):  # three different 17-token prompts, two blocks each, into a budget of two blocks
            prompt = list(range(100 + 20 * start, 117 + 20 * start))
            specdec.generate(target, prompt, specdec.SamplingParams(temperature=0, max_tokens=1))
        assert len(cache) == 2 and cache.evicted_blocks == 4
    finally:
        target.backend.prefix_cache = None


def test_float_modes_refuse_prefix_caching(tiny_target):
    with pytest.raises(SpecdecError, match="exact only where"):
        specdec.enable_prefix_caching(tiny_target)
    assert tiny_target.backend.prefix_cache is None


def test_seeded_sampling_draws_the_same_text_with_a_warm_prefix_cache(quantized_pair):
    """Restored rows are the bits a prompt pass computes (target and draft alike), so a seeded
    sampled request answers the same with or without earlier prompts in the caches."""
    target, draft = quantized_pair
    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=16, seed=11, ignore_eos=True)
    spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=3)
    cold = specdec.generate(target, CHAT[1], params, draft=draft, spec=spec).token_ids
    for model in (target, draft):
        specdec.enable_prefix_caching(model, gb=0.1, block_size=8)
    try:
        specdec.generate(target, CHAT[0], params, draft=draft, spec=spec)
        warm = specdec.generate(target, CHAT[1], params, draft=draft, spec=spec)
        assert draft.backend.prefix_cache.hit_tokens >= 16  # the draft's prompt pass started from its cache too
    finally:
        target.backend.prefix_cache = draft.backend.prefix_cache = None
    assert warm.stats.cached_prompt_tokens >= 16
    assert warm.token_ids == cold


def test_server_reuses_a_conversations_earlier_turns(tiny_dirs, int4_kernel):
    """`specdec serve` on int8 caches prefixes by default: a conversation's second turn reports
    cached prompt tokens in usage and /metrics, and answers what the library answers with no cache;
    POST /reset_prefix_cache empties it (400 where it is off); --no-enable-prefix-caching turns it
    off; asking for it on float weights refuses to start."""
    import httpx

    from tests.test_server import launch, serving

    target = specdec.load_model(tiny_dirs["target"], quantize="int8")
    system = {"role": "system", "content": "You are a careful assistant who answers every question in one short line."}
    first = [system, {"role": "user", "content": "What is two plus two?"}]
    second = first + [{"role": "assistant", "content": "Four."}, {"role": "user", "content": "And three plus three?"}]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    expected = [specdec.generate(target, specdec.api.encode_prompt(target, turns, chat=True), params).text
                for turns in (first, second)]
    for flag, caches in (([], True), (["--no-enable-prefix-caching"], False)):
        with serving(launch("--model", str(tiny_dirs["target"]), "--draft-model", str(tiny_dirs["draft"]),
                            "--quantize", "int8", "--prompt-quantize", "same",  # the library's (auto: timing noise here)
                            "--served-model-name", "tiny", *flag)) as base:
            cached, texts = [], []
            for turns in (first, second):
                body = {"model": "tiny", "messages": turns, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
                response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
                assert response.status_code == 200, response.text
                texts.append(response.json()["choices"][0]["message"]["content"])
                cached.append(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
            metrics = httpx.get(f"{base}/metrics", timeout=10).text
            reset = httpx.post(f"{base}/reset_prefix_cache", timeout=30)
            suffix_reset = httpx.post(f"{base}/reset_suffix_cache", timeout=30)
            body = {"model": "tiny", "messages": second, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
            again = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60).json()
        assert texts == expected
        assert suffix_reset.status_code == 200 and suffix_reset.json()["object"] == "suffix_cache.reset"
        assert cached[0] == 0 and (cached[1] >= 16 if caches else cached[1] == 0)
        # after a reset the same conversation starts cold, and answers the same
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert again["choices"][0]["message"]["content"] == expected[1]
        if caches:
            assert reset.status_code == 200 and reset.json()["blocks_dropped"] > 0
        else:
            assert reset.status_code == 400 and reset.json()["error"]["code"] == "prefix_caching_disabled"
        hits = float(next(line.split()[-1] for line in metrics.splitlines()
                          if line.startswith("specdec_prefix_cache_hit_tokens_total")))
        assert hits == cached[1]
        # what the caches hold, per model: with the hit counter alone eviction showed only as falling cached_tokens
        gauges = {line.split()[0]: float(line.split()[-1]) for line in metrics.splitlines()
                  if line.startswith("specdec_prefix_cache_") and "{" in line}
        if caches:
            assert gauges['specdec_prefix_cache_usage_bytes{model="target"}'] > 0
            assert 'specdec_prefix_cache_usage_bytes{model="draft"}' in gauges  # (it drafts only where γ=auto says it pays)
            assert gauges['specdec_prefix_cache_capacity_bytes{model="target"}'] > gauges['specdec_prefix_cache_usage_bytes{model="target"}']
            assert gauges['specdec_prefix_cache_evicted_blocks_total{model="target"}'] == 0
            assert gauges['specdec_prefix_cache_restored_tokens_total{model="target"}'] == cached[1]
            assert gauges['specdec_prefix_cache_queried_tokens_total{model="target"}'] >= sum(cached)
        else:
            assert not gauges
    with pytest.raises(RuntimeError, match="exact only where"):
        launch("--model", str(tiny_dirs["target"]), "--dtype", "float32", "--quantize", "none", "--enable-prefix-caching")


def test_a_conversations_next_turn_starts_after_the_cached_answer(quantized_pair):
    """Where decoding runs the prompt pass's kernels (int8; int4 alone) the answer's keys/values are
    stored too, so the next turn reuses prompt and answer; with an int8 prompt twin beside int4
    decoding only the prompt is reused. Either way the next turn's output is its output cold."""
    target, draft = quantized_pair
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    spec = specdec.SpecConfig(method="draft_model", num_speculative_tokens=3)
    first = target.tokenizer.encode(CHAT[0])
    answer = specdec.generate(target, first, params, draft=draft, spec=spec).token_ids
    second = first + answer + target.tokenizer.encode("\nQ: and 3+3?")
    cold = specdec.generate(target, second, params, draft=draft, spec=spec).token_ids
    specdec.enable_prefix_caching(target, gb=0.1, block_size=4)
    try:
        assert specdec.generate(target, first, params, draft=draft, spec=spec).token_ids == answer
        warm = specdec.generate(target, second, params, draft=draft, spec=spec)
    finally:
        target.backend.prefix_cache = None
    assert warm.token_ids == cold
    if target.backend.prompt_backend is target.backend:
        assert warm.stats.cached_prompt_tokens >= len(first) + len(answer) - 4
    else:
        assert warm.stats.cached_prompt_tokens <= len(first)
