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

from interleaved import add_pair_args, group_prompts, header, load_pair

import specdec
from specdec import adaptive
from specdec.drafters.suffix import clear_global_caches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(parser)
    parser.add_argument("--methods", default="draft_model,draft_suffix")
    args = parser.parse_args()
    target, draft = load_pair(args)
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    optimistic = adaptive.OPTIMISTIC_ALPHA
    plan: dict[str, tuple[str | None, float]] = {"plain": (None, optimistic)}
    for method in args.methods.split(","):
        plan[f"{method} old"] = (method, 0.0)
        plan[f"{method} new"] = (method, optimistic)
    print(header(args, "γ=auto"), flush=True)
    print("| group | config | e2e tok/s | × plain | α | tokens drafted |\n|---|---|---|---|---|---|")
    for group, prompt_ids in group_prompts(target, args):
        results: dict[str, list[tuple[float, ...]]] = {}
        for number, ids in enumerate(prompt_ids):
            plain_speed, plain_tokens = 0.0, None
            for name, (method, floor) in plan.items():
                adaptive.OPTIMISTIC_ALPHA = floor  # 0: plan with the running α from the first round
                clear_global_caches()
                spec = None if method is None else specdec.SpecConfig(method=method, num_speculative_tokens="auto")
                out = specdec.generate(target, ids, params, draft=None if spec is None else draft, spec=spec)
                s = out.stats
                speed = s.generated_tokens / s.total_time_s
                if spec is None:
                    plain_speed, plain_tokens = speed, out.token_ids
                elif out.token_ids != plain_tokens:
                    print(f"MISMATCH {name} on {group} prompt {number}", flush=True)
                results.setdefault(name, []).append((speed, speed / plain_speed, s.acceptance_rate, s.proposed_tokens))
        adaptive.OPTIMISTIC_ALPHA = optimistic
        for name, values in results.items():
            m = [statistics.median(column) for column in zip(*values)]
            print(f"| {group} | {name} | {m[0]:.1f} | {m[1]:.2f} | {m[2]:.2f} | {m[3]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
