"""CUDA graphs for decode and verification steps: one recorded launch instead of ~900.

Why: a step of the 1.5B target is ~900 small kernels. On an H100 they take ~4 ms of GPU time, but
issuing them from Python takes ~27 ms (measured: `benchmarks/results/2026-11-24/cuda_step_cost.md`),
so an eager step is bound by the CPU, not by the GPU or its memory. A CUDA graph records the step's
kernels once and replays them with one launch.

A graph replays fixed kernels on fixed tensor addresses, so a recorded step may not depend on Python
numbers that change between steps. The decoder's ``static_cache`` mode provides that: the new
tokens' ids and positions come from two device tensors, keys/values are written at slots
``positions``, and attention covers the whole cache under a mask built from ``positions`` on the
device. One graph is recorded per (cache storage, chunk size T) the first time it is needed; cache
storage comes from a pool (capacity rounded up to ``SLOT_ROUNDING``) so the next request reuses the
same tensors, and with them the graphs already recorded. Prefill chunks, tree masks, reduced
vocabularies and layer subsets run eagerly.
"""

from __future__ import annotations

import weakref
from typing import Sequence

import torch

from specdec.models.kv_cache import KVCache
from specdec.models.transformer import Decoder

#: chunks of up to this many tokens (decode steps and verification chunks) are replayed as graphs
MAX_GRAPH_TOKENS = 16
#: cache capacities are rounded up to a multiple of this, so requests of similar lengths share storage
SLOT_ROUNDING = 256


class CudaGraphRunner:
    """Records and replays the decoder's ``static_cache`` forward for small chunks on CUDA."""

    def __init__(self, decoder: Decoder, max_tokens: int = MAX_GRAPH_TOKENS) -> None:
        self.decoder = decoder
        self.max_tokens = max_tokens
        self.device = decoder.device
        self.memory_pool = None  # one pool for all graphs (they replay one at a time); made at first record
        self.free_storage: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        #: (data pointer of the storage's keys, T) → (graph, ids buffer, positions buffer, logits)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.pooled: weakref.WeakSet[KVCache] = weakref.WeakSet()

    def new_cache(self, max_seq_len: int) -> KVCache:
        """A cache of ``max_seq_len`` slots on pooled storage (returned to the pool when the cache dies)."""
        capacity = -(-max_seq_len // SLOT_ROUNDING) * SLOT_ROUNDING
        free = self.free_storage.setdefault(capacity, [])
        if free:
            storage = free.pop()
        else:
            fresh = self.decoder.new_cache(capacity)
            storage = fresh.k, fresh.v
        cfg = self.decoder.config
        cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, max_seq_len, storage=storage)
        weakref.finalize(cache, free.append, storage)
        self.pooled.add(cache)
        return cache

    def can_run(self, cache: KVCache, tokens: int, layers: Sequence[int] | None, return_hidden: bool,
                vocab_limit: int | None) -> bool:
        return (0 < tokens <= self.max_tokens and cache in self.pooled and layers is None and not return_hidden
                and cache.features is None  # recorded graphs do not store features (EAGLE runs eagerly)
                and (vocab_limit is None or vocab_limit >= self.decoder.config.vocab_size))

    def forward(self, cache: KVCache, ids: torch.Tensor, num_logits: int | None) -> torch.Tensor:
        """Logits of the chunk ``ids`` appended at ``cache.seq_len`` (as ``Decoder.forward``)."""
        tokens = ids.numel()
        start = cache.reserve(tokens)
        key = (cache.k.data_ptr(), tokens)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._record(cache, ids, start)
        else:
            graph, static_ids, static_positions, _ = entry
            static_ids.copy_(ids, non_blocking=True)
            static_positions.copy_(torch.arange(start, start + tokens), non_blocking=True)
            graph.replay()
        cache.advance(tokens)
        logits = entry[3]
        return (logits if num_logits is None else logits[-num_logits:]).clone()

    def _record(self, cache: KVCache, ids: torch.Tensor, start: int
                ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Record this step's graph: the warm-up run computes the step for real (same inputs), the
        recording only captures, and a first replay produces the logits."""
        static_ids = ids.to(self.device).clone()
        static_positions = torch.arange(start, start + ids.numel(), device=self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up off the capture: lazy cuBLAS/allocator set-up happens here
            self.decoder(static_ids, static_positions, cache, static_cache=True)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self.memory_pool is None:
            self.memory_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.memory_pool):
            logits = self.decoder(static_ids, static_positions, cache, static_cache=True)
        graph.replay()
        return graph, static_ids, static_positions, logits
