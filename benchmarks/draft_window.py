"""Does the draft model's prompt pass pay on long prompts? draft_suffix / draft_model with the draft
reading the whole prompt vs only its last N tokens (``SpecConfig.draft_context_window``), against
plain decoding of the same target, interleaved per prompt, greedy (every output checked identical),
γ=auto.

    .venv/bin/python benchmarks/draft_window.py --groups summarization,rag --windows 0,512,128
    .venv/bin/python benchmarks/draft_window.py --groups my_long_prompts.jsonl --methods draft_suffix

Prints per group and (method, window) the medians over prompts of end-to-end tokens/s (prompt
included), its ratio to plain (per prompt, then the median), the worst prompt's ratio, α and TTFT.
The CPU flags go in the header so results from different machines are not mixed up.
"""

from __future__ import annotations

import argparse
import statistics

from interleaved import add_pair_args, compare_to_plain, header, load_pair

import specdec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(parser)
    parser.set_defaults(groups="summarization,rag", max_tokens=96)
    parser.add_argument("--methods", default="draft_suffix,draft_model", help="comma-separated speculative methods")
    parser.add_argument("--windows", default="0,512,128", help="draft context windows to compare (0 = whole prompt)")
    args = parser.parse_args()
    target, draft = load_pair(args)
    plan: dict[str, specdec.SpecConfig | None] = {"plain": None}
    for method in args.methods.split(","):
        for window in (int(w) for w in args.windows.split(",")):
            plan[f"{method} window={window or 'all'}"] = specdec.SpecConfig(method=method, draft_context_window=window)
    print(header(args, "γ=auto, draft context windows"), flush=True)
    print("| group | config | e2e tok/s | × plain | worst prompt × plain | α | TTFT s |\n|---|---|---|---|---|---|---|")
    for group, results in compare_to_plain(target, draft, args, plan):
        for name, runs in results.items():
            speed, ratio, alpha, ttft = (statistics.median(column) for column in zip(
                *((s, r, out.stats.acceptance_rate, out.stats.ttft_s) for s, r, out in runs)))
            worst = min(r for _, r, _ in runs)
            print(f"| {group} | {name} | {speed:.1f} | {ratio:.2f} | {worst:.2f} | {alpha:.2f} | {ttft:.2f} |", flush=True)


if __name__ == "__main__":
    main()
