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

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from interleaved import add_pair_args, compare_to_plain, header, load_pair  # noqa: E402

import specdec  # noqa: E402
import specdec.engine as engine  # noqa: E402

NEW = engine.learn


def old_learn(gamma, verify_costs, drafter, fitted, verified, draft_s, verify_s):  # noqa: ANN001, ANN201
    """The rule before: a take-over round's table tokens counted as the model's."""
    old = dataclasses.replace(fitted, draft=dataclasses.replace(fitted.draft, model_tokens=None))
    return NEW(gamma, verify_costs, drafter, old, verified, draft_s, verify_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(parser)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    target, draft = load_pair(args)
    plan: dict[str, specdec.SpecConfig | None] = {"plain": None}
    for repeat in range(args.repeats):
        for variant in ("old", "new"):
            plan[f"{variant}#{repeat}"] = specdec.SpecConfig(method="draft_suffix")

    def before(name: str) -> None:
        engine.learn = old_learn if name.startswith("old") else NEW  # type: ignore[assignment]

    print(header(args, "draft_suffix γ=auto, take-over rounds learnt as model + table tokens (old) or the model's (new)"), flush=True)
    print("| group | variant | e2e tok/s | × plain | τ | draft-model forwards / rounds |\n|---|---|---|---|---|---|")
    for group, results in compare_to_plain(target, draft, args, plan, before):
        for variant in ("old", "new"):
            runs = [run for name, rs in results.items() if name.startswith(variant) for run in rs]
            prompts = len(runs) // args.repeats
            by_prompt = [[runs[r * prompts + p] for r in range(args.repeats)] for p in range(prompts)]
            speed = statistics.median(statistics.median(s for s, _, _ in runs_) for runs_ in by_prompt)
            ratio = statistics.median(statistics.median(r for _, r, _ in runs_) for runs_ in by_prompt)
            tau = statistics.median(out.stats.mean_accepted_len for _, _, out in runs)
            forwards = statistics.median(out.stats.draft_forwards or 0 for _, _, out in runs)
            rounds = statistics.median(len(out.stats.rounds) for _, _, out in runs)
            print(f"| {group} | {variant} | {speed:.1f} | {ratio:.2f} | {tau:.2f} | {forwards:.0f} / {rounds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
