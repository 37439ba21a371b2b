"""A/B of draft_suffix's cost-aware choice (session 70): "new" verifies the suffix table's less sure proposal instead
of running the draft model where it promises more committed tokens per second (and always where γ=auto gives the
draft model k = 0); "old" used the table only when its first token was estimated >= 0.5 likely. Plain decoding, then
old and new alternately, interleaved per prompt, greedy, every output checked identical to plain.

    .venv/bin/python benchmarks/copy_choice_ab.py --groups summarization,rag,humaneval,mt_bench --repeats 2
"""

from __future__ import annotations

from interleaved import old_new_main

from specdec.drafters.draft_suffix import SuffixAssistedDrafter

NEW = SuffixAssistedDrafter._copy_pays


def use_old(old: bool) -> None:
    SuffixAssistedDrafter._copy_pays = (lambda self, copied, k: False) if old else NEW  # type: ignore[method-assign]


if __name__ == "__main__":
    old_new_main(__doc__, "draft_suffix", "γ=auto, draft_suffix old vs new copy choice", use_old)
