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

from interleaved import add_pair_args, group_prompts, header, load_pair

import specdec
from specdec.drafters.suffix import clear_global_caches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(parser)
    parser.add_argument("--methods", default="draft_suffix,draft_model")
    args = parser.parse_args()
    target, draft = load_pair(args)
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    plan: dict[str, specdec.SpecConfig | None] = {"plain": None}
    for method in args.methods.split(","):
        for gamma in (4, "auto"):
            plan[f"{method} γ={gamma}"] = specdec.SpecConfig(method=method, num_speculative_tokens=gamma)
    print(header(args, "γ=4 vs γ=auto"), flush=True)
    print("| group | config | e2e tok/s | × plain | α | worst prompt × plain |\n|---|---|---|---|---|---|")
    for group, prompt_ids in group_prompts(target, args):
        results: dict[str, list[tuple[float, ...]]] = {}
        for number, ids in enumerate(prompt_ids):
            plain_speed, plain_tokens = 0.0, None
            for name, spec in plan.items():
                clear_global_caches()
                out = specdec.generate(target, ids, params, draft=None if spec is None else draft, spec=spec)
                speed = out.stats.generated_tokens / out.stats.total_time_s
                if spec is None:
                    plain_speed, plain_tokens = speed, out.token_ids
                elif out.token_ids != plain_tokens:
                    print(f"MISMATCH {name} on {group} prompt {number}", flush=True)
                results.setdefault(name, []).append((speed, speed / plain_speed, out.stats.acceptance_rate))
        for name, values in results.items():
            medians = [statistics.median(column) for column in zip(*values)]
            worst = min(ratio for _, ratio, _ in values)
            print(f"| {group} | {name} | {medians[0]:.1f} | {medians[1]:.2f} | {medians[2]:.2f} | {worst:.2f} |", flush=True)


if __name__ == "__main__":
    main()
