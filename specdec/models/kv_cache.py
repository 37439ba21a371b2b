"""Static, preallocated key/value cache.

Allocated once per sequence at its final size, so a decode step never allocates. Speculative decoding
needs two extra operations beyond "append": ``truncate(n)`` drops the entries of rejected draft tokens
(chain rollback is just moving the length back: the stale slots are overwritten by the next forward),
and ``keep(indices)`` compacts the entries of one accepted path after tree verification.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from specdec.errors import ContextLengthError
from specdec.huge_pages import zeros_on_huge_pages


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A cache tensor: on a CPU on 2 MiB pages where the OS offers them (a decode step streams the cached
    keys and values like the weights: specdec/huge_pages.py), else torch.zeros."""
    huge = zeros_on_huge_pages(shape, dtype) if torch.device(device).type == "cpu" else None
    return huge if huge is not None else torch.zeros(shape, dtype=dtype, device=device)


class KVCache:
    """Keys and values for every layer of one sequence: ``k[layer]`` is ``[kv_heads, max_seq_len, head_dim]``."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_seq_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        storage: tuple[torch.Tensor, torch.Tensor] | None = None,
        feature_storage: Callable[[int], torch.Tensor] | None = None,
    ) -> None:
        """``storage``: reuse these ``(k, v)`` tensors (at least ``max_seq_len`` slots) instead of
        allocating — CUDA graphs record tensor addresses, so a replayed step needs the same ones.
        ``feature_storage(width)``: where :meth:`record_features` takes its ``[slots, width]``
        buffer from (the same pool, for the same reason); None: a fresh one."""
        shape = (num_layers, num_kv_heads, max_seq_len, head_dim)
        if storage is None:
            storage = _zeros(shape, dtype, device), _zeros(shape, dtype, device)
        self.k, self.v = storage
        if self.k.shape[2] < max_seq_len:
            raise ValueError(f"storage has {self.k.shape[2]} slots, fewer than {max_seq_len}")
        self.max_seq_len = max_seq_len
        self.seq_len = 0  # number of valid positions, identical for every layer
        #: ``[max_seq_len, hidden × len(feature_layers)]``: the hidden states of every cached position
        #: at :attr:`feature_layers`, kept only when a feature-level drafter (EAGLE, Medusa) asks
        #: :meth:`record_features`
        self.features: torch.Tensor | None = None
        #: where :attr:`features` come from: the residual stream entering each of these layers, in
        #: this order (``num_layers``: the final hidden state, before the final norm); () when not recording
        self.feature_layers: tuple[int, ...] = ()
        self._feature_storage = feature_storage

    def record_features(self, hidden_size: int, layers: Sequence[int] = ()) -> None:
        """From now on every forward also stores its rows' hidden states at ``layers`` (default: the
        final one) in :attr:`features`, side by side, slot by slot like the keys and values (so
        truncate and keep apply to them too): the target features a head drafts from, at no extra
        forward. EAGLE-3 heads read a low, a middle and the final layer's."""
        layers = tuple(layers) or (self.k.shape[0],)
        if any(not 0 < layer <= self.k.shape[0] for layer in layers) or list(layers) != sorted(set(layers)):
            raise ValueError(f"feature layers {layers} must ascend within 1 .. {self.k.shape[0]}")
        if self.features is not None:
            if layers != self.feature_layers:
                raise ValueError(f"this cache records the features of layers {self.feature_layers}, not {layers}")
            return
        width = hidden_size * len(layers)
        self.features = (self._feature_storage(width) if self._feature_storage is not None
                         else torch.zeros(self.max_seq_len, width, dtype=self.k.dtype, device=self.k.device))
        self.feature_layers = layers

    def write_features(self, start: int | torch.Tensor, hidden: torch.Tensor, layer: int) -> None:
        """Store ``hidden [T, hidden]``, the residual stream entering ``layer``, at slots ``start ..
        start+T`` or at the slots of a ``[T]`` tensor (a step recorded as a CUDA graph), when this
        cache records that layer's features (else nothing)."""
        if layer not in self.feature_layers:
            return
        assert self.features is not None
        part = self.feature_layers.index(layer)
        width = hidden.shape[-1]
        columns = self.features[:, part * width : (part + 1) * width]
        if isinstance(start, torch.Tensor):
            columns.index_copy_(0, start, hidden.to(self.features.dtype))
        else:
            columns[start : start + hidden.shape[0]] = hidden

    def reserve(self, num_new: int) -> int:
        """Check that ``num_new`` more entries fit and return the slot where they start."""
        start = self.seq_len
        if start + num_new > self.max_seq_len:
            raise ContextLengthError(
                f"KV cache full: {start} + {num_new} tokens exceed its {self.max_seq_len} slots"
            )
        return start

    def write(self, layer: int, start: int | torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store ``[kv_heads, T, head_dim]`` keys/values of one layer at slots ``start .. start+T``,
        or at the slots of a ``[T]`` tensor (no Python integer: a step recordable as a CUDA graph)."""
        if isinstance(start, torch.Tensor):
            self.k[layer].index_copy_(1, start, keys)
            self.v[layer].index_copy_(1, start, values)
            return
        end = start + keys.shape[1]
        self.k[layer, :, start:end] = keys
        self.v[layer, :, start:end] = values

    def advance(self, num_new: int) -> None:
        """Mark ``num_new`` more slots valid (called once per forward, after every layer wrote)."""
        self.seq_len += num_new

    def truncate(self, length: int) -> None:
        """Roll back to the first ``length`` positions (rejected draft tokens are forgotten)."""
        if not 0 <= length <= self.seq_len:
            raise ValueError(f"cannot truncate a cache of length {self.seq_len} to {length}")
        self.seq_len = length

    def keep(self, indices: list[int] | torch.Tensor, start: int) -> None:
        """Keep slots ``start + indices`` (ascending) as the positions right after ``start``.

        Used after tree verification: the accepted path's entries are scattered among the tree's
        nodes and are moved down to be contiguous, then everything after them is dropped.
        """
        index = torch.as_tensor(indices, dtype=torch.long, device=self.k.device) + start
        count = index.numel()
        self.k[:, :, start : start + count] = self.k[:, :, index]
        self.v[:, :, start : start + count] = self.v[:, :, index]
        if self.features is not None:
            self.features[start : start + count] = self.features[index]
        self.seq_len = start + count

    @property
    def nbytes(self) -> int:
        extra = 0 if self.features is None else self.features.numel() * self.features.element_size()
        return self.k.numel() * self.k.element_size() * 2 + extra
