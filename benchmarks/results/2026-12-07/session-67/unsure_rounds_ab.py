"""draft_suffix: unsure table proposals vs the draft model chosen per request by realized rate (new) or the
draft model wherever the table is unsure (old). Needs unsure-rounds-bandit.patch (here) applied:

    git apply benchmarks/results/2026-12-07/session-67/unsure-rounds-bandit.patch
    .venv/bin/python benchmarks/results/2026-12-07/session-67/unsure_rounds_ab.py --quantize int8 \
        --groups summarization,rag,humaneval,mt_bench --repeats 2
"""
from __future__ import annotations
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from interleaved import old_new_main  # noqa: E402
from specdec.drafters.draft_suffix import SuffixAssistedDrafter  # noqa: E402

def use_old(old: bool) -> None:
    SuffixAssistedDrafter.choose_by_rate = not old

if __name__ == "__main__":
    old_new_main(__doc__, "draft_suffix", "draft_suffix γ=auto: unsure rounds by realized rate (new) or draft model (old)", use_old)
