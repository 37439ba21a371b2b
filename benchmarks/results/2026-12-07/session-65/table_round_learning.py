"""draft_suffix: what the γ controller learns from a round the suffix table finished (a take-over). "old" counts
the table's free tokens as the draft model's (α and cost per token over model + table tokens); "new" (the code with
table-round-learning.patch) learns from the model's tokens only (Draft.model_tokens). Interleaved per prompt (plain, old, new, old,
new), greedy, γ=auto, every output checked identical to plain decoding.

    cd benchmarks && ../.venv/bin/python results/2026-12-07/session-65/table_round_learning.py --quantize int8 \
        --groups summarization,rag,humaneval,mt_bench

Prints per group and variant the medians over prompts of end-to-end tokens/s, its ratio to plain, τ, the draft
model's forwards and the rounds.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from interleaved import old_new_main  # noqa: E402

import specdec.engine as engine  # noqa: E402

NEW = engine.learn


def old_learn(gamma, verify_costs, drafter, fitted, verified, draft_s, verify_s):  # noqa: ANN001, ANN201
    """The rule before: a take-over round's table tokens counted as the model's."""
    old = dataclasses.replace(fitted, draft=dataclasses.replace(fitted.draft, model_tokens=None))
    return NEW(gamma, verify_costs, drafter, old, verified, draft_s, verify_s)


def use_old(old: bool) -> None:
    engine.learn = old_learn if old else NEW  # type: ignore[assignment]


if __name__ == "__main__":
    old_new_main(__doc__, "draft_suffix", "draft_suffix γ=auto, take-over rounds learnt as model + table tokens (old) "
                 "or the model's (new)", use_old)
