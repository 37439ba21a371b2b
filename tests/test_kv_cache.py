"""KVCache.keep: compacting the accepted path of a verified tree (the operation tree verification
needs beyond a chain's truncate)."""

from __future__ import annotations

import pytest
import torch

from specdec.models.kv_cache import KVCache
from specdec.models.weights import load_decoder
from tests.model_fixtures import TINY_LLAMA, TINY_QWEN2, write_tiny_model


def filled_cache(length: int = 10) -> KVCache:
    cache = KVCache(num_layers=2, num_kv_heads=2, head_dim=3, max_seq_len=16)
    start = cache.reserve(length)
    for layer in range(2):
        values = torch.arange(2 * length * 3, dtype=torch.float32).reshape(2, length, 3) + 1000 * layer
        cache.write(layer, start, values, -values)
    cache.advance(length)
    return cache


@pytest.mark.parametrize("indices", [[1, 3, 4], torch.tensor([0, 2, 5, 6]), [], [0, 1, 2]],
                         ids=["list", "tensor", "none-kept", "already-contiguous"])
def test_keep_gathers_the_chosen_slots_after_start(indices):
    cache = filled_cache(10)
    before_k, before_v = cache.k.clone(), cache.v.clone()
    start = 3
    kept = torch.as_tensor(indices, dtype=torch.long) + start
    cache.keep(indices, start)
    assert cache.seq_len == start + len(kept)
    end = start + len(kept)
    torch.testing.assert_close(cache.k[:, :, start:end], before_k[:, :, kept], atol=0, rtol=0)
    torch.testing.assert_close(cache.v[:, :, start:end], before_v[:, :, kept], atol=0, rtol=0)
    # the committed prefix is untouched
    assert torch.equal(cache.k[:, :, :start], before_k[:, :, :start]) and torch.equal(cache.v[:, :, :start], before_v[:, :, :start])


# A token tree after a prefix: node i has token TREE_TOKENS[i], parent TREE_PARENTS[i] (-1 = the
# prefix), depth = its RoPE offset. Two branches at depth 0; the accepted path is nodes 1 -> 2 -> 4,
# scattered among siblings, so keep() must move entries down, not just truncate.
TREE_TOKENS = [11, 22, 33, 44, 55]
TREE_PARENTS = [-1, -1, 1, 0, 2]
ACCEPTED = [1, 2, 4]


def tree_mask(prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [T] and the attention mask [T, prefix + T]: the prefix and a node's own ancestors."""
    nodes = len(TREE_TOKENS)
    mask = torch.zeros(nodes, prefix + nodes, dtype=torch.bool)
    mask[:, :prefix] = True
    depths = []
    for node in range(nodes):
        ancestor, depth = node, -1
        while ancestor != -1:
            mask[node, prefix + ancestor] = True
            ancestor, depth = TREE_PARENTS[ancestor], depth + 1
        depths.append(depth)
    return torch.tensor(depths) + prefix, mask


@pytest.mark.parametrize("config", [TINY_QWEN2, TINY_LLAMA], ids=["qwen2", "llama"])
def test_keep_after_tree_verification_continues_like_a_fresh_forward_over_the_path(tmp_path, config):
    decoder = load_decoder(write_tiny_model(tmp_path, config, seed=5))
    prefix_ids = torch.randint(0, 512, (9,), generator=torch.Generator().manual_seed(0))
    prefix, next_token = len(prefix_ids), 77

    cache = decoder.new_cache(32)
    decoder(prefix_ids, torch.arange(prefix), cache)
    positions, mask = tree_mask(prefix)
    tree_logits = decoder(torch.tensor(TREE_TOKENS), positions, cache, attn_mask=mask)
    tree_k, tree_v = cache.k.clone(), cache.v.clone()
    cache.keep(ACCEPTED, start=prefix)

    path = torch.tensor([TREE_TOKENS[i] for i in ACCEPTED])
    assert cache.seq_len == prefix + len(ACCEPTED)
    slots = torch.tensor(ACCEPTED) + prefix
    assert torch.equal(cache.k[:, :, prefix : cache.seq_len], tree_k[:, :, slots])
    assert torch.equal(cache.v[:, :, prefix : cache.seq_len], tree_v[:, :, slots])

    fresh = decoder.new_cache(32)
    fresh_logits = decoder(torch.cat([prefix_ids, path, torch.tensor([next_token])]), torch.arange(prefix + len(ACCEPTED) + 1), fresh)
    # the tree scored each accepted node as the plain sequence scores it ...
    torch.testing.assert_close(tree_logits[ACCEPTED], fresh_logits[prefix : prefix + len(ACCEPTED)], atol=1e-4, rtol=1e-4)
    # ... and the compacted cache carries on from the path as if only the path had been run
    after = decoder(torch.tensor([next_token]), torch.tensor([prefix + len(ACCEPTED)]), cache)
    torch.testing.assert_close(after[0], fresh_logits[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(cache.k[:, :, : fresh.seq_len], fresh.k[:, :, : fresh.seq_len], atol=1e-4, rtol=1e-4)
    assert cache.seq_len == fresh.seq_len


def test_keep_without_compaction_would_be_wrong(tmp_path):
    """The tree test above can fail: continuing from a truncated (not compacted) tree cache attends to
    the wrong branch's entries and gives different logits."""
    decoder = load_decoder(write_tiny_model(tmp_path, TINY_QWEN2, seed=5))
    prefix_ids = torch.randint(0, 512, (9,), generator=torch.Generator().manual_seed(0))
    prefix = len(prefix_ids)
    positions, mask = tree_mask(prefix)
    compacted, truncated = decoder.new_cache(32), decoder.new_cache(32)
    for cache in (compacted, truncated):
        decoder(prefix_ids, torch.arange(prefix), cache)
        decoder(torch.tensor(TREE_TOKENS), positions, cache, attn_mask=mask)
    compacted.keep(ACCEPTED, start=prefix)
    truncated.truncate(prefix + len(ACCEPTED))
    step = torch.tensor([77]), torch.tensor([prefix + len(ACCEPTED)])
    assert not torch.allclose(decoder(*step, compacted), decoder(*step, truncated), atol=1e-3)

