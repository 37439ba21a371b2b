"""The small interface between the engine/drafters and whatever executes a model.

The engine only needs: score a chunk of new tokens appended to a sequence (logits for every position,
or the last few), and roll a sequence back. Sequence state (the KV cache) is a separate object so one
loaded model serves many concurrent requests. Methods that need a model's internals (layer skip,
feature heads, tree attention) ask for :class:`specdec.backends.torch_backend.TorchBackend` and say so
when given another backend.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from specdec.models.config import ModelConfig
from specdec.prefix_cache import PrefixCache
from specdec.tree import TreeLayout


@runtime_checkable
class SequenceState(Protocol):
    """Per-request model state: how many positions are cached, and rollback."""

    seq_len: int
    max_seq_len: int

    def truncate(self, length: int) -> None: ...

    def keep(self, indices: list[int], start: int) -> None:
        """Keep slots ``start + indices`` as the positions right after ``start`` (tree verification)."""
        ...


@runtime_checkable
class Backend(Protocol):
    config: ModelConfig
    device: torch.device
    dtype_name: str  # execution dtype as users read it: "float32", "bfloat16", "int8" …
    mode: str  # the execution mode step-cost curves are keyed by ("int4-all" where dtype_name says "int4")
    #: forward seconds per chunk size T measured on this machine, or None (the γ cost model's prior)
    step_seconds: dict[int, float] | None
    #: real ÷ probe forward seconds at the chunk sizes timed on the loaded model
    #: (:mod:`specdec.step_calibration`); {} when not timed
    step_ratios: dict[int, float]

    #: the backend that runs this model's prompt passes: itself, or the same model in an execution
    #: mode whose many-row forwards are cheaper, writing the same caches (TorchBackend.use_for_prompts)
    prompt_backend: "Backend"
    #: keys/values of earlier prompts' blocks this model's prompt passes may start from, or None
    #: (specdec/prefix_cache.py; :func:`specdec.api.enable_prefix_caching` sets it where it is exact)
    prefix_cache: PrefixCache | None

    def new_state(self, max_seq_len: int) -> SequenceState: ...

    def forward(self, state: SequenceState, tokens: Sequence[int], num_logits: int | None = None,
                tree: TreeLayout | None = None, vocab_limit: int | None = None) -> torch.Tensor:
        """Append ``tokens`` at positions ``state.seq_len ..`` and return float32 logits
        ``[len(tokens) or num_logits, vocab]``. ``tree``: the tokens end this tree region of the
        cache (positions by depth, each token attending to its ancestors: :mod:`specdec.tree`).
        ``vocab_limit``: score only ids below it (a draft's reduced vocabulary; None: all)."""
        ...

    def forward_batch(self, calls: Sequence[tuple[SequenceState, Sequence[int], int | None, TreeLayout | None]],
                      vocab_limit: int | None = None) -> list[torch.Tensor]:
        """Several requests' ``(state, tokens, num_logits, tree)`` in one forward where the backend
        can (each result bit-identical to its own :meth:`forward`), else one after another."""
        ...

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights read per forward (for the achieved-bandwidth figure)."""
        ...

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of keys/values one cached token holds (every later forward's attention reads them)."""
        ...

    def weight_passes(self, calls: int) -> int:
        """How many times a :meth:`forward_batch` of ``calls`` calls reads the weights: once where it batches them,
        ``calls`` where it runs them one after another (the server's GB/s figure)."""
        ...
