"""Which γ should a user get when they give none: a fixed 4 (vLLM-style) or ``auto`` (γ from measured
acceptance and step costs, drafting stopped where it does not pay; HF transformers' assisted generation
adapts its number of draft tokens by default too)? Plain decoding, then each method at γ=4 and at
γ=auto, interleaved per prompt, greedy, every output checked identical to plain decoding; suffix caches
cleared before every run.

    .venv/bin/python benchmarks/gamma_default.py --groups humaneval,mt_bench,summarization --max-tokens 96

Prints per group and configuration the medians over prompts of end-to-end tokens/s (prompt included),
its ratio to plain (per prompt, then the median), α, and the worst prompt's ratio.
"""

from __future__ import annotations

import argparse
import statistics

from interleaved import add_pair_args, compare_to_plain, header, load_pair

import specdec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(parser)
    parser.add_argument("--methods", default="draft_suffix,draft_model")
    args = parser.parse_args()
    target, draft = load_pair(args)
    plan: dict[str, specdec.SpecConfig | None] = {"plain": None}
    for method in args.methods.split(","):
        for gamma in (4, "auto"):
            plan[f"{method} γ={gamma}"] = specdec.SpecConfig(method=method, num_speculative_tokens=gamma)
    print(header(args, "γ=4 vs γ=auto"), flush=True)
    print("| group | config | e2e tok/s | × plain | α | worst prompt × plain |\n|---|---|---|---|---|---|")
    for group, results in compare_to_plain(target, draft, args, plan):
        for name, runs in results.items():
            speed, ratio, alpha = (statistics.median(column) for column in
                                   zip(*((s, r, out.stats.acceptance_rate) for s, r, out in runs)))
            worst = min(r for _, r, _ in runs)
            print(f"| {group} | {name} | {speed:.1f} | {ratio:.2f} | {alpha:.2f} | {worst:.2f} |", flush=True)


if __name__ == "__main__":
    main()
