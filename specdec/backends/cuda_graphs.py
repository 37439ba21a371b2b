"""CUDA graphs for decode and verification steps: one recorded launch instead of ~900.

Why: a step of the 1.5B target is ~900 small kernels. On an H100 they take ~4 ms of GPU time, but
issuing them from Python takes ~27 ms (measured: `benchmarks/results/2026-11-24/cuda_step_cost.md`),
so an eager step is bound by the CPU, not by the GPU or its memory. A CUDA graph records the step's
kernels once and replays them with one launch.

A graph replays fixed kernels on fixed tensor addresses, so a recorded step may not depend on Python
numbers that change between steps. The decoder's ``static_cache`` mode provides that: the new
tokens' ids and positions come from two device tensors, keys/values are written at slots
``positions``, and attention covers the whole cache under a mask built from ``positions`` on the
device. Token trees (tree speculation: nodes at one depth share a position but not a slot) record
graphs of their own, whose slots and ``[T, capacity]`` ancestor mask are device buffers too, copied
in before each replay: a tree of T nodes then costs what a T-token chain costs, the premise of
trees on a GPU, where a 16-token step costs ~1.2 single-token steps (an eager tree step was ~4× a
graphed one: launch-bound). One graph is recorded per (cache storage, chunk size T, chain or tree)
the first time it is needed; cache storage comes from a pool (capacity rounded up to
``SLOT_ROUNDING``) so the next request reuses the same tensors, and with them the graphs already
recorded. A request whose drafter reads the target's features (EAGLE, Medusa) records graphs that
also write each row's hidden states at the layers its head reads, at its slot, into a feature
buffer kept with the pooled storage (a fixed address again); before, such a request ran every
target step eagerly, 4–8× a replayed one (an H100's host, an H200's). Prefill chunks, reduced
vocabularies and layer subsets run eagerly.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

import torch

from specdec.models.kv_cache import KVCache
from specdec.models.transformer import Decoder

#: chunks of up to this many tokens (decode steps, verification chunks, trees) are replayed as graphs
MAX_GRAPH_TOKENS = 24
#: cache capacities are rounded up to a multiple of this, so requests of similar lengths share storage
SLOT_ROUNDING = 256


@dataclass
class RecordedStep:
    """One recorded graph and the device buffers it reads and writes (fixed addresses)."""

    graph: torch.cuda.CUDAGraph | None  # None until recorded
    ids: torch.Tensor  # [T] token ids
    positions: torch.Tensor  # [T] RoPE positions
    slots: torch.Tensor | None  # [T] cache slots (trees; None: a chain's slots are its positions)
    mask: torch.Tensor | None  # [T, capacity] bool, True = may attend (trees; None: causal)
    logits: torch.Tensor  # [T, vocab] float32, written by each replay


class CudaGraphRunner:
    """Records and replays the decoder's ``static_cache`` forward for small chunks on CUDA."""

    def __init__(self, decoder: Decoder, max_tokens: int = MAX_GRAPH_TOKENS) -> None:
        self.decoder = decoder
        self.max_tokens = max_tokens
        self.device = decoder.device
        self.memory_pool = None  # one pool for all graphs (they replay one at a time); made at first record
        self.free_storage: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        #: (data pointer of the storage's keys, T, is a tree, the layers whose features it records) → its recorded step
        self.graphs: dict[tuple[int, int, bool, tuple[int, ...]], RecordedStep] = {}
        #: (data pointer of a pooled storage's keys, width) → its feature buffer (:meth:`_features_for`)
        self.feature_storage: dict[tuple[int, int], torch.Tensor] = {}
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
        cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, max_seq_len, storage=storage,
                        feature_storage=lambda width, keys=storage[0]: self._features_for(keys, width))
        weakref.finalize(cache, free.append, storage)
        self.pooled.add(cache)
        return cache

    def _features_for(self, keys: torch.Tensor, width: int) -> torch.Tensor:
        """The ``[slots, width]`` feature buffer of the pooled storage whose keys are ``keys``, made on
        first use and kept with it: a graph that records features (an EAGLE or Medusa request's
        target steps) writes them at a fixed address, so every cache on that storage recording as
        many layers uses this one."""
        key = keys.data_ptr(), width
        if key not in self.feature_storage:
            self.feature_storage[key] = torch.zeros(keys.shape[2], width, dtype=keys.dtype, device=keys.device)
        return self.feature_storage[key]

    def can_run(self, cache: KVCache, tokens: int, layers: Sequence[int] | None, return_hidden: bool,
                vocab_limit: int | None) -> bool:
        return (0 < tokens <= self.max_tokens and cache in self.pooled and layers is None and not return_hidden
                and (vocab_limit is None or vocab_limit >= self.decoder.config.vocab_size))

    @torch.inference_mode()
    def forward(self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                num_logits: int | None) -> torch.Tensor:
        """Logits of the chunk ``ids [T]`` appended at ``cache.seq_len`` (as ``Decoder.forward``):
        ``positions [T]`` on the device; ``mask [T, seq_len + T]`` a tree's (None: a chain).
        In inference mode, as the eager forward: a step's buffers first made inside it (the
        self-distillation continuations run in inference mode) are inference tensors, which a
        later replay outside it could not fill (train-drafter's report failed so on a GPU)."""
        tokens = ids.numel()
        start = cache.reserve(tokens)
        key = (cache.k.data_ptr(), tokens, mask is not None, cache.feature_layers)
        step = self.graphs.get(key)
        fresh = step is None
        if step is None:
            step = self.graphs[key] = self._buffers(cache, tokens, mask is not None)
        step.ids.copy_(ids, non_blocking=True)
        step.positions.copy_(positions, non_blocking=True)
        if mask is not None:  # a tree: its key gave it slot and mask buffers
            assert step.slots is not None and step.mask is not None
            step.slots.copy_(torch.arange(start, start + tokens), non_blocking=True)
            width = mask.shape[1]
            step.mask[:, :width].copy_(mask, non_blocking=True)
            step.mask[:, width:].fill_(False)
        if fresh:
            self._record(cache, step)
        else:
            step.graph.replay()
        cache.advance(tokens)
        return (step.logits if num_logits is None else step.logits[-num_logits:]).clone()

    def _buffers(self, cache: KVCache, tokens: int, tree: bool) -> RecordedStep:
        """A step's input buffers (its graph and logits come with the recording)."""
        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=self.device)
        capacity = cache.k.shape[2]
        return RecordedStep(None, zeros(tokens), zeros(tokens),
                            zeros(tokens) if tree else None,
                            zeros(tokens, capacity, dtype=torch.bool) if tree else None, zeros(0))

    def _run(self, cache: KVCache, step: RecordedStep) -> torch.Tensor:
        return self.decoder(step.ids, step.positions, cache, step.mask, static_cache=True, slots=step.slots)

    def _record(self, cache: KVCache, step: RecordedStep) -> None:
        """Record ``step``'s graph over its filled buffers (:func:`record_graph`)."""
        if self.memory_pool is None:
            self.memory_pool = torch.cuda.graph_pool_handle()
        step.graph, step.logits = record_graph(lambda: self._run(cache, step), self.device, self.memory_pool)


Outputs = TypeVar("Outputs")


def record_graph(run: Callable[[], Outputs], device: torch.device, pool: tuple | None = None) -> tuple[torch.cuda.CUDAGraph, Outputs]:
    """``run`` (kernels on fixed buffers) as a CUDA graph, and the tensors it writes at each replay.
    A warm-up run on a side stream computes it for real (lazy cuBLAS and allocator set-up stay out of
    the capture), the recording only captures, and a first replay fills the outputs. ``pool``: a
    memory pool shared with other graphs that replay one at a time (None: the graph's own)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = run()
    graph.replay()
    return graph, outputs
