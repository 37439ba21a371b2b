"""Seeded sampling that speculation cannot change: each position's token is a function of the request's
seed, the position and the target's distribution there — not of the drafter, γ, trees or the load.

Why. Rejection sampling (:mod:`specdec.verify`) spends its random draws per round: an accept test per
drafted token, then one draw for the emitted token. Which sample a seed gives therefore depends on how
many tokens each round drafted, which drafter drafted them and what it proposed — on γ=auto's measured
timings, on a shared suffix table's history, on the server's load. A seeded request's text changed
from call to call, and never equalled plain decoding's with the same seed (vLLM and SGLang behave so
too). Here a seeded request's text is plain decoding's, whatever speculates.

How (the Gumbel-max trick in its exponential-race form). For position t, draw E_x ~ Exp(1)
independently for every token id x from a generator keyed by (seed, t); the token is
argmax_x p(x) / E_x, which is distributed exactly as p (the first of independent exponential clocks
with rates p(x) to ring). Plain decoding takes that token. A drafter proposes argmax_x q(x) / E_x with
the same clocks, and verification accepts a drafted token iff it is the target's own choice at its
position: the longest matching prefix, then the target's choice — greedy verification over noisy
scores, exact because every committed token *is* the plain decoding's token. The shared clocks couple
draft and target: they agree with probability close to Σ min(p, q), rejection sampling's acceptance —
teacher-forced on the real pair at t=0.7, 0.4–2.5 points below it, where a draft sampling on its own
would be 3–16 points below (benchmarks/results/2026-12-06/session-61/).

Unseeded requests keep rejection sampling: nothing asks their text to repeat, and it accepts a little
more. The clocks are drawn on the CPU for every device, so a seed picks the same token wherever the
target's distribution is the same.
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch

from specdec.sampling import SamplingParams, greedy_ids, logits_to_probs

#: clocks kept for reuse: a round's draft steps draw them, its verification reads them again (~0.5 ms a
#: position at 152 k ids; 0.6 MB each)
RECENT_POSITIONS = 32
_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1


def position_key(seed: int, position: int) -> int:
    """The generator seed of ``position``'s clocks. torch's CPU generator keeps 32 bits of a seed, so a
    request's positions take consecutive keys after one 64-bit mix of its seed (SplitMix64's
    finaliser): no two positions of a request under 2**32 tokens share their clocks."""
    mixed = (seed + 0x9E3779B97F4A7C15) & _MASK64
    mixed = ((mixed ^ (mixed >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    mixed = ((mixed ^ (mixed >> 27)) * 0x94D049BB133111EB) & _MASK64
    mixed ^= mixed >> 31
    return (mixed + position) & _MASK32


def race_times(seed: int, position: int, vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[vocab_size]`` float32: each token id's Exp(1) clock at ``position`` (−log of a uniform; a
    uniform of exactly 0, 2**-24 of the time, makes a clock that never rings first — its token would
    win then with probability ~1e-7 of its own). A shorter vocabulary reads the same clocks' prefix.
    Read-only: the same tensor serves the draft's step and the target's row at a position."""
    return _cpu_race_times(seed, position, vocab_size).to(device)


@functools.lru_cache(maxsize=RECENT_POSITIONS)
def _cpu_race_times(seed: int, position: int, vocab_size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(position_key(seed, position))
    return -torch.log(torch.rand(vocab_size, generator=generator))


def seeded_choice(probs: torch.Tensor, seed: int, position: int) -> int:
    """The token at ``position`` for ``probs [V]`` (or ``[1, V]``; the output of
    :func:`~specdec.sampling.logits_to_probs`, so filtered tokens hold 0 and never win): the first
    clock to ring, argmax p(x) / E_x."""
    row = probs.reshape(-1)
    return int(greedy_ids(row / race_times(seed, position, row.shape[0], row.device)))


def chain_clocks(params: SamplingParams, position: int, probs: torch.Tensor) -> torch.Tensor | None:
    """A seeded request's clocks ``[k, V]`` at the positions of a drafted chain whose first token is at
    ``position`` (``probs [k, V]``: its draft distributions), for ranking alternatives by noisy score
    (:func:`specdec.alternatives.with_alternatives`); None for an unseeded request."""
    if not params.is_seeded_sampling:
        return None
    assert params.seed is not None
    return torch.stack([race_times(params.seed, position + i, probs.shape[-1], probs.device) for i in range(probs.shape[0])])


def target_choice(target_logits: torch.Tensor, row: int, params: SamplingParams, position: int) -> int:
    """The target's seeded token after ``target_logits[row]``, at ``position``."""
    assert params.seed is not None
    return seeded_choice(logits_to_probs(target_logits[row : row + 1], params), params.seed, position)


def seeded_verify(draft_tokens: Sequence[int], target_logits: torch.Tensor, params: SamplingParams,
                  position: int) -> tuple[int, int]:
    """``draft_tokens [k]``, ``target_logits [k+1, V]`` (row i: after the i-th drafted token), row 0
    choosing the token at ``position`` → ``(n_accepted, next_token)``: the drafted tokens that are the
    target's own choices, then its choice where they stop. Rows past the first mismatch are never
    transformed (a softmax over the vocabulary and a clock draw each)."""
    tokens = list(draft_tokens)
    if target_logits.shape[0] != len(tokens) + 1:
        raise ValueError(f"verify: {len(tokens)} draft tokens need {len(tokens) + 1} target rows, got {target_logits.shape[0]}")
    path, token = seeded_tree_walk(tokens, {node - 1: [node] for node in range(len(tokens))}, target_logits, params, position)
    return len(path), token  # a chain is the tree whose node i follows node i - 1


def seeded_tree_walk(draft_tokens: Sequence[int], kids: dict[int, list[int]], target_logits: torch.Tensor,
                     params: SamplingParams, position: int) -> tuple[list[int], int]:
    """:func:`seeded_verify` for a tree: from the root, follow the child that is the target's choice at
    its depth (row i + 1 follows node i; ``kids``: :func:`specdec.tree.children`) → ``(path, next_token)``."""
    path: list[int] = []
    node, row = -1, 0
    while True:
        token = target_choice(target_logits, row, params, position + len(path))
        match = next((child for child in kids.get(node, []) if draft_tokens[child] == token), None)
        if match is None:
            return path, token
        path.append(match)
        node, row = match, match + 1
