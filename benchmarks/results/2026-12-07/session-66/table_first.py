"""draft_suffix: should the suffix table's proposal be used whenever it has one ("new"), not only when its first token
is estimated >= 0.5 likely ("old", the code as it is)? On long documents the draft model's rounds, run where the table
was unsure, had 0.53 tokens accepted against 1.01 for the same unsure table proposals in suffix-alone runs
(round_types.py). Interleaved per prompt (plain, old, new, ...), greedy, γ=auto, outputs checked identical to plain.

    .venv/bin/python benchmarks/results/2026-12-07/session-66/table_first.py --quantize int8 --groups summarization,humaneval,mt_bench --repeats 1
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Generator

sys.path.insert(0, str(Path(__file__).resolve().parents[3]) if "results" in __file__ else "/work/main/benchmarks")
from interleaved import old_new_main  # noqa: E402

from specdec.drafters.draft_suffix import SuffixAssistedDrafter  # noqa: E402

OLD = SuffixAssistedDrafter.propose_steps


def table_first(self: SuffixAssistedDrafter, context_ids: list[int], k: int) -> Generator:
    """The table's proposal whenever it has one; the draft model only where the table has nothing."""
    copied = self.suffix.propose(context_ids, k)
    if copied.tokens and copied.prefix_accept:
        self._last = self.suffix
        self.suffix_rounds += 1
        return copied
    return (yield from OLD(self, context_ids, k))


def use_old(old: bool) -> None:
    SuffixAssistedDrafter.propose_steps = OLD if old else table_first  # type: ignore[method-assign]


if __name__ == "__main__":
    old_new_main(__doc__, "draft_suffix", "draft_suffix γ=auto: table proposal whenever present (new) or only when trusted (old)",
                 use_old)
