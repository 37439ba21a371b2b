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

import argparse
import statistics
from typing import Generator

from interleaved import add_pair_args, compare_to_plain, header, load_pair

import specdec
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
        SuffixAssistedDrafter.propose_steps = old_propose_steps if name.startswith("old") else NEW  # type: ignore[method-assign]

    print(header(args, "draft_suffix γ=auto, table-vs-draft choice by expected rate (new) or trust only (old)"), flush=True)
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
