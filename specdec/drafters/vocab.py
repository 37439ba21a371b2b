"""Which token ids a drafter's logits score, and how they become a proposal over the whole vocabulary.

A draft may score only part of the vocabulary — a prefix of the ids (``--draft-vocab-size``: the
draft's LM head cut to its first rows) or a trained head's own ids (EAGLE-3's frequency-ranked draft
vocabulary, ``HeadConfig.draft_vocab``) — because its LM head rows are most of what a draft step
reads. Greedy drafting needs only the argmax, taken over the scored rows and mapped to its token id:
spreading a row over the whole vocabulary first (a 151 936-entry fill and scatter, then an argmax
over all of it) cost ~0.4 ms per draft token on a Zen 4 core, a tenth of an EAGLE head step.
Sampling, and a grammar's mask, need the whole vocabulary: q is 0 at every unscored id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def full_vocab(logits: torch.Tensor, vocab_size: int, greedy: bool, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Draft logits ``[V']`` over a vocabulary prefix (``V' <= vocab_size``), or over the token ids
    ``ids [V']``, as a proposal over the whole vocabulary: the unscored ids get -inf, so q is exactly
    0 there — a valid proposal distribution, which rejection sampling corrects like any other. A
    prefix needs no padding under greedy: the argmax over a prefix of ids is already a token id."""
    if ids is None and (greedy or logits.shape[-1] >= vocab_size):
        return logits
    full = logits.new_full((vocab_size,), float("-inf"))
    if ids is None:
        full[: logits.shape[-1]] = logits
    else:
        full[ids] = logits
    return full


def usable_vocab_limit(vocab_limit: int | None, vocab_size: int) -> int | None:
    return vocab_limit if vocab_limit and vocab_limit < vocab_size else None


@dataclass(frozen=True)
class DraftVocab:
    """The rows a draft scores: row j is token ``ids[j]`` (``ids [N]``), or token j when ``ids`` is
    None (the whole vocabulary, or a prefix of it)."""

    vocab_size: int
    ids: torch.Tensor | None = None

    def token(self, row: int) -> int:
        """The token id row ``row`` scores."""
        return row if self.ids is None else int(self.ids[row])

    def tokens(self, rows: torch.Tensor) -> list[int]:
        """The token ids of ``rows [R]`` (row indices)."""
        return (rows if self.ids is None else self.ids[rows]).tolist()

    def full(self, logits: torch.Tensor) -> torch.Tensor:
        """Row logits ``[N]`` as logits over the whole vocabulary ``[vocab_size]`` (-inf where unscored)."""
        return full_vocab(logits, self.vocab_size, False, self.ids)
