"""draft_suffix: should an unsure suffix-table proposal win a round over the draft model when it is expected to
commit more tokens per second? "old" uses the table only when its first token is estimated ≥ suffix_trust
(0.5) and proposes nothing when γ=auto gives the draft model k = 0; "new" (the code as it is) also takes the
table's proposal when its expected rate (1 + acceptance estimates over their verification) beats the γ
controller's expected rate for the draft model's k, and offers it when k = 0. Interleaved per prompt
(plain, old, new, old, new), greedy, γ=auto, every output checked identical to plain decoding.

    .venv/bin/python benchmarks/draft_suffix_choice.py --quantize int8 --groups summarization,rag,humaneval,mt_bench

Prints per group and variant the medians over prompts of end-to-end tokens/s, its ratio to plain, τ, the draft
model's forwards and the rounds.
"""

from __future__ import annotations

from typing import Generator

from interleaved import old_new_main

from specdec.drafters.base import Draft
from specdec.drafters.draft_suffix import SuffixAssistedDrafter

NEW = SuffixAssistedDrafter.propose_steps


def old_propose_steps(self: SuffixAssistedDrafter, context_ids: list[int], k: int) -> Generator:
    """The rule before: the table's proposal only when trusted, nothing at k = 0."""
    copied = self.suffix.propose(context_ids, k)
    if copied.prefix_accept and copied.prefix_accept[0] >= self.suffix_trust:
        self._last = self.suffix
        self.suffix_rounds += 1
        return copied
    if k == 0:
        self._last = None
        return Draft(tokens=[])
    self._last = self.draft
    self.draft_rounds += 1
    self._context = context_ids
    self._taken = None
    return (yield from self.draft.propose_steps(context_ids, k))


def use_old(old: bool) -> None:
    SuffixAssistedDrafter.propose_steps = old_propose_steps if old else NEW  # type: ignore[method-assign]


if __name__ == "__main__":
    old_new_main(__doc__, "draft_suffix", "draft_suffix γ=auto, table-vs-draft choice by expected rate (new) or trust only (old)",
                 use_old)
