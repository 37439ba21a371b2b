"""γ=auto with and without trying the drafter before judging it (``specdec.adaptive.OPTIMISTIC_ALPHA``):
plain decoding, then each method with the optimism switched off ("old") and on ("new"), interleaved
per prompt, greedy, every output checked identical to plain decoding. Suffix caches are cleared before
every run (a table that remembers the previous configuration's answer to the same prompt would draft it).

    .venv/bin/python benchmarks/gamma_auto_try.py --limit 6 --methods draft_model,draft_suffix

Prints per group and configuration the medians over prompts of end-to-end tokens/s (prompt included),
its ratio to plain (per prompt, then the median), α and the tokens drafted per request.
"""

from __future__ import annotations

import argparse
import statistics

from interleaved import add_pair_args, compare_to_plain, header, load_pair

import specdec
from specdec import adaptive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(parser)
    parser.add_argument("--methods", default="draft_model,draft_suffix")
    args = parser.parse_args()
    target, draft = load_pair(args)
    optimistic = adaptive.OPTIMISTIC_ALPHA
    plan: dict[str, specdec.SpecConfig | None] = {"plain": None}
    floors = {"plain": optimistic}
    for method in args.methods.split(","):
        for name, floor in ((f"{method} old", 0.0), (f"{method} new", optimistic)):
            plan[name] = specdec.SpecConfig(method=method, num_speculative_tokens="auto")
            floors[name] = floor

    def set_floor(name: str) -> None:  # 0: plan with the running α from the first round
        adaptive.OPTIMISTIC_ALPHA = floors[name]

    print(header(args, "γ=auto"), flush=True)
    print("| group | config | e2e tok/s | × plain | α | tokens drafted |\n|---|---|---|---|---|---|")
    try:
        for group, results in compare_to_plain(target, draft, args, plan, before=set_floor):
            for name, runs in results.items():
                m = [statistics.median(column) for column in
                     zip(*((s, r, out.stats.acceptance_rate, out.stats.proposed_tokens) for s, r, out in runs))]
                print(f"| {group} | {name} | {m[0]:.1f} | {m[1]:.2f} | {m[2]:.2f} | {m[3]:.0f} |", flush=True)
    finally:
        adaptive.OPTIMISTIC_ALPHA = optimistic


if __name__ == "__main__":
    main()
