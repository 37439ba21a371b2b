"""A head's draft vocabulary from its training data: the token ids the target produces most often.

A head scores only ``draft_vocab_size`` rows of the target's LM head — that is what keeps its draft
step cheap. The first ids of a BPE vocabulary are roughly its most frequent (FR-Spec), but not on every
kind of text: on code, 5–8 % of the target's tokens have ids past 32768, and a head can never draft
those. EAGLE-3 instead scores the ids most frequent in its training data (its "d2t" map); so does a
``"frequency"`` head here, keeping the ids with its weights (``draft_ids``). The rest of the rows go
to the lowest ids not yet chosen, so text unlike the training data still finds its common tokens.
"""

from __future__ import annotations

import torch


def frequency_ids(target_ids: torch.Tensor, size: int, vocab_size: int) -> torch.Tensor:
    """The ``size`` ids to score, ascending: the target's greedy tokens ``target_ids`` (any shape,
    -1 = padding) by falling count, then the lowest ids not among them."""
    tokens = target_ids[target_ids >= 0].long().flatten()
    counts = torch.bincount(tokens, minlength=vocab_size)[:vocab_size]
    seen = torch.nonzero(counts).flatten()
    ranked = seen[torch.argsort(counts[seen], descending=True, stable=True)][:size]
    unseen = torch.ones(vocab_size, dtype=torch.bool)
    unseen[ranked] = False
    fill = torch.nonzero(unseen).flatten()[: size - len(ranked)]
    return torch.sort(torch.cat([ranked, fill])).values


def coverage(target_ids: torch.Tensor, draft_ids: torch.Tensor | None, size: int) -> float:
    """The share of the target's tokens in ``target_ids`` (-1 = padding) a head can draft: those in
    ``draft_ids``, or below ``size`` when the vocabulary is the first ids."""
    tokens = target_ids[target_ids >= 0].long().flatten()
    if tokens.numel() == 0:
        return 0.0
    if draft_ids is None:
        return float((tokens < size).float().mean())
    return float(torch.isin(tokens, draft_ids.cpu()).float().mean())
