"""Sampling parameters and the ONE logits → probabilities transform.

The same function turns the target's logits into p and the draft's logits into q before
verification (ARCHITECTURE principle 4): rejection sampling is only exact when both sides see the
same temperature / top-k / top-p / min-p. Order, as vLLM: temperature, top-k, top-p, min-p.
Greedy (temperature 0) is its own exact-match path and never goes through probabilities.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from specdec.errors import SpecdecError


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 => greedy
    top_k: int = 0  # 0 or -1 => off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0 or self.temperature != self.temperature:
            raise SpecdecError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecdecError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise SpecdecError(f"min_p must be in [0, 1), got {self.min_p}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise SpecdecError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise SpecdecError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise SpecdecError("stop strings must be non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise SpecdecError("stop_token_ids must be non-negative integers")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[..., V]`` logits → float32 probabilities, row-wise, after temperature/top-k/top-p/min-p.

    Greedy returns the one-hot of the argmax (ties → lowest id, as ``torch.argmax``). Ties at the
    top-k boundary keep every token tied with the k-th (so the set does not depend on sort order);
    top-p keeps the smallest prefix of the sorted distribution whose mass reaches ``top_p``,
    including the token that crosses it.
    """
    logits = logits.float()
    if params.is_greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p  # tokens entirely beyond the nucleus
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    if params.min_p > 0.0:
        threshold = params.min_p * probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A private generator per request: reproducible with a seed, independent of global RNG state."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1))
    return generator


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a ``[V]`` distribution by inverse CDF with one uniform from ``generator``."""
    cdf = torch.cumsum(probs.float(), dim=-1)
    u = torch.rand((), generator=generator, device=probs.device) * cdf[-1]
    index = int(torch.searchsorted(cdf, u.reshape(1), right=True))
    index = min(index, probs.shape[-1] - 1)
    while probs[index] <= 0 and index > 0:  # u landed exactly on a boundary of a zero-mass run
        index -= 1
    return index


def greedy_token(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits, dim=-1))
