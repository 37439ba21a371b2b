"""One EAGLE draft step recorded as a CUDA graph: on a GPU the head is launch-bound.

A chain's draft step (the head's layer over one predicted feature and the drafted token, the target's
final norm, its LM-head rows) is ~30 small kernels; issued from Python they took 0.8–1.3 ms on a lent
H200 (0.2–0.3 of the 1.5B target's 4 ms step), while the GPU work is a fraction of that. Recorded once
per request — the head's cache is the request's own, so its addresses are fixed for the request's
life — a step replays with one launch. Like the target's graphs (specdec/backends/cuda_graphs.py)
nothing of a step may be a Python number: the token, its RoPE position and its cache slot come from
device buffers, keys/values go to that slot and attention covers the whole cache under a mask built
on the device. The first pass of a round (over the newly committed positions, a varying count) and
token trees run eagerly.
"""

from __future__ import annotations

from typing import Callable

import torch

from specdec.backends.cuda_graphs import record_graph
from specdec.models.heads import EagleHead
from specdec.models.kv_cache import KVCache
from specdec.models.transformer import Decoder


class EagleStepGraph:
    """A recorded chain step of ``head`` over its ``cache``, scored by ``scorer`` (the target's LM-head
    rows); :meth:`step` has the same results as the eager step, within float rounding."""

    def __init__(self, head: EagleHead, decoder: Decoder, scorer: Callable[[torch.Tensor], torch.Tensor], cache: KVCache) -> None:
        self.head, self.decoder, self.scorer, self.cache = head, decoder, scorer, cache
        device = cache.k.device
        self.feature = torch.zeros(1, head.config.hidden_size, dtype=head.rope_cos.dtype, device=device)
        self.token = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple[torch.Tensor, torch.Tensor] | None = None

    def _run(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager step on the buffers: predicted feature ``[1, hidden]`` and draft logits ``[1, rows]``."""
        embed = self.decoder.model.embed_tokens(self.token).to(self.feature.dtype)
        mask = torch.arange(self.cache.k.shape[2], device=self.slot.device) <= self.slot[:, None]  # [1, capacity]
        predicted = self.head(self.feature, embed, self.position, self.cache, mask, slots=self.slot)
        logits = self.scorer(self.decoder.model.norm(predicted.to(self.decoder.float_dtype))).float()
        return predicted, logits

    @torch.inference_mode()
    def step(self, feature: torch.Tensor, token: int, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the pair (``feature [1, hidden]``, ``token``) at RoPE ``position`` to the head's cache;
        returns the predicted next feature ``[1, hidden]`` and the draft logits ``[1, rows]`` (copies)."""
        slot = self.cache.reserve(1)
        self.feature.copy_(feature)
        self.token.fill_(token)
        self.position.fill_(position)
        self.slot.fill_(slot)
        if self.graph is None:
            self.graph, self.out = record_graph(self._run, self.feature.device)
        else:
            self.graph.replay()
        self.cache.advance(1)
        predicted, logits = self.out
        return predicted.clone(), logits.clone()
