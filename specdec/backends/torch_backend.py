"""Our own PyTorch decoder as a :class:`~specdec.backends.base.Backend` (CPU and CUDA)."""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.models.kv_cache import KVCache
from specdec.models.transformer import Decoder


class TorchBackend:
    """Wraps a :class:`Decoder`; each request gets its own :class:`KVCache` from :meth:`new_state`."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self.config = decoder.config
        weight = decoder.model.embed_tokens.weight
        self.device = weight.device
        self.dtype_name = decoder.quantization or str(weight.dtype).removeprefix("torch.")

    def new_state(self, max_seq_len: int) -> KVCache:
        return self.decoder.new_cache(max_seq_len)

    def forward(
        self,
        state: KVCache,
        tokens: Sequence[int] | torch.Tensor,
        num_logits: int | None = None,
        layers: Sequence[int] | None = None,
        return_hidden: bool = False,
        vocab_limit: int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        ids = torch.as_tensor(tokens, dtype=torch.long, device=self.device).reshape(-1)
        positions = torch.arange(state.seq_len, state.seq_len + ids.numel(), device=self.device)
        return self.decoder(ids, positions, state, num_logits=num_logits, layers=layers, return_hidden=return_hidden,
                            vocab_limit=vocab_limit)

    @property
    def weight_bytes(self) -> int:
        return self.decoder.weight_bytes

    def synchronize(self) -> None:
        """Wait for queued device work so wall-clock timings mean something on CUDA."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
