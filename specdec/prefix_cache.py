"""Automatic prefix caching: a new request reuses the keys/values earlier prompts computed.

Why: on a CPU a prompt pass is compute-bound (~0.5–0.8 s for a 100-token chat prompt on the 1.5B
target), and under load prompts are what stalls everyone's next token. Many prompts start the same
way: the chat template's system turn, a shared few-shot preamble, and above all the earlier turns of
a conversation (questions and answers), which a chat client sends again with every new message.
vLLM and SGLang keep such prefixes (automatic prefix caching, RadixAttention); so do we, for our
static per-request caches.

How: a prompt is cut into blocks of ``block_size`` tokens. Block i of a prompt is keyed by (the key
of block i-1, its tokens) — exact token equality, no hashing, so two prompts share an entry only if
they agree on every token up to its end. After a request's prompt pass its full blocks are copied
out of its cache; a later request copies the longest run of cached blocks into its own cache and
runs its prompt pass over the rest only (at least the last prompt token, whose logits it needs).

Exactness: the copied keys/values must be the bits the request's own prompt pass would have
written. That holds where the prompt pass computes each row independently of the rows beside it
(the int8/int4 CPU paths: :func:`specdec.chunking.default_prefill_chunk`'s condition, checked by
``tests/test_prefix_cache.py`` with ``torch.equal``), and only for rows computed by the kernels a
prompt pass runs: where decoding runs them too (int8; int4 without a prompt twin) a finished
request's answer is stored with its prompt — the next turn of a conversation starts after it — and
where prompts run on a twin (int4 decoding, int8 prompt passes) only the prompt is.

Memory: entries live in a byte budget, least recently used evicted first. A lookup touches its
blocks from the last to the first, so a block is always at least as recent as any block after it
in the same prompt, and eviction removes the ends of prefixes before their beginnings (no
unreachable entries stay behind).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

from specdec.config import DEFAULT_BLOCK_SIZE
from specdec.models.kv_cache import KVCache

#: (the previous block's entry id, or -1 for the first block; this block's tokens)
BlockKey = tuple[int, tuple[int, ...]]


@dataclass
class Block:
    """One cached block: its keys and values ``[layers, kv_heads, block_size, head_dim]``."""

    entry_id: int
    keys: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()


class PrefixCache:
    """Keys/values of earlier prompts' blocks for one model (one execution mode, one device)."""

    def __init__(self, max_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.max_bytes = max_bytes
        self.block_size = block_size
        self.blocks: OrderedDict[BlockKey, Block] = OrderedDict()  # least recently used first
        self.nbytes = 0
        self._next_id = 0
        #: prompt tokens looked up / found cached since start (Prometheus-style counters)
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.evicted_blocks = 0  # dropped to stay within max_bytes, since start

    def _keys(self, tokens: Sequence[int], limit: int) -> list[tuple[BlockKey, Block]]:
        """The cached blocks that start ``tokens``, in order, covering at most ``limit`` tokens."""
        found: list[tuple[BlockKey, Block]] = []
        parent = -1
        for start in range(0, limit - self.block_size + 1, self.block_size):
            key = (parent, tuple(tokens[start : start + self.block_size]))
            block = self.blocks.get(key)
            if block is None:
                break
            found.append((key, block))
            parent = block.entry_id
        return found

    def _touch(self, keys: list[BlockKey]) -> None:
        for key in reversed(keys):  # last block first: every block stays as recent as its successors
            self.blocks.move_to_end(key)

    def restore(self, state: KVCache, prompt: Sequence[int]) -> int:
        """Copy the longest cached prefix of ``prompt`` (whole blocks, never its last token) into
        the empty cache ``state``; return how many tokens it holds now (0: nothing cached)."""
        if state.seq_len != 0:
            raise ValueError("a prefix is restored into an empty cache only")
        self.queried_tokens += len(prompt)
        if state.features is not None:  # a feature drafter (EAGLE) needs every row's features: not kept
            return 0
        found = self._keys(prompt, min(len(prompt) - 1, state.max_seq_len))
        if not found:
            return 0
        for index, (_, block) in enumerate(found):
            start = index * self.block_size
            state.k[:, :, start : start + self.block_size] = block.keys
            state.v[:, :, start : start + self.block_size] = block.values
        restored = len(found) * self.block_size
        state.advance(restored)
        self._touch([key for key, _ in found])
        self.hit_tokens += restored
        return restored

    def store(self, state: KVCache, prompt: Sequence[int]) -> None:
        """After ``state``'s prompt pass over ``prompt``: keep its full blocks not cached yet."""
        block_bytes = 2 * state.k[:, :, : self.block_size].numel() * state.k.element_size()
        if state.features is not None or block_bytes > self.max_bytes:  # (a budget under one block holds none)
            return
        length = min(len(prompt), state.seq_len)
        found = self._keys(prompt, length)
        keys = [key for key, _ in found]
        parent = found[-1][1].entry_id if found else -1
        for start in range(len(found) * self.block_size, length - self.block_size + 1, self.block_size):
            block = Block(self._next_id, state.k[:, :, start : start + self.block_size].clone(),
                          state.v[:, :, start : start + self.block_size].clone())
            self._next_id += 1
            key = (parent, tuple(prompt[start : start + self.block_size]))
            self.blocks[key] = block
            self.nbytes += block.nbytes
            keys.append(key)
            parent = block.entry_id
        self._touch(keys)
        self._evict()

    def reset(self) -> int:
        """Drop every block (``POST /reset_prefix_cache``: a benchmark sending the same prompts
        twice, or freeing memory); the hit counters keep counting. Returns the blocks dropped."""
        dropped = len(self.blocks)
        self.blocks.clear()
        self.nbytes = 0
        return dropped

    def _evict(self) -> None:
        while self.nbytes > self.max_bytes and self.blocks:
            _, block = self.blocks.popitem(last=False)
            self.nbytes -= block.nbytes
            self.evicted_blocks += 1

    def __len__(self) -> int:
        return len(self.blocks)
