"""Which draft vocabulary pays: the draft model scoring its whole vocabulary or only the first N token
ids (``--draft-vocab-size N``, EAGLE-3 / FR-Spec style), against plain decoding of the same target,
configurations interleaved per prompt, greedy (every output checked identical to plain decoding).

A cut head makes every draft step cheaper (the 0.5B draft's 151936-row head is ~1/3 of its step) but
every target token with an id ≥ N is a certain miss that ends the round. Prints per group the medians
over prompts of α, τ, the draft step (ms), end-to-end tokens/s (prompt included) and its ratio to plain
(per prompt, then the median), and the share of the target's tokens the cut vocabulary cannot draft.

    .venv/bin/python benchmarks/draft_vocab.py --groups humaneval,gsm8k,mt_bench --limit 6 --sizes 0,65536,32768
"""

from __future__ import annotations

import argparse
import statistics

from interleaved import add_pair_args, compare_to_plain, header, load_pair

import specdec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(parser)
    parser.add_argument("--sizes", default="0,65536,32768", help="draft vocabulary sizes to compare (0 = whole)")
    parser.add_argument("--gamma", default="auto", help="num_speculative_tokens (default: auto)")
    args = parser.parse_args()
    target, draft = load_pair(args)
    gamma: int | str = int(args.gamma) if args.gamma.isdigit() else args.gamma
    plan: dict[str, specdec.SpecConfig | None] = {"plain": None}
    for size in (int(s) for s in args.sizes.split(",")):
        plan[f"vocab {size or 'all'}"] = specdec.SpecConfig(method="draft_model", num_speculative_tokens=gamma,
                                                            draft_vocab_size=size)
    print(header(args, f"γ={gamma}"), flush=True)
    for group, runs in compare_to_plain(target, draft, args, plan):
        results: dict[str, dict[str, list[float]]] = {name: {} for name in plan}
        for name, spec in plan.items():
            size = spec.draft_vocab_size if spec is not None else 0
            for speed, ratio, out in runs[name]:
                s = out.stats
                values = {"alpha": s.acceptance_rate, "tau": s.mean_accepted_len, "speed": speed, "ratio": ratio,
                          "draft_ms": 1e3 * s.draft_time_s / s.proposed_tokens if s.proposed_tokens else 0.0,
                          "uncovered": (sum(t >= size for t in out.token_ids) / len(out.token_ids)) if size else 0.0}
                for key, value in values.items():
                    results[name].setdefault(key, []).append(value)
        prompts = len(runs["plain"])
        print(f"\n## {group} ({prompts} prompts, medians)\n")
        print("| config | α | τ | draft ms/token | e2e tok/s | × plain | target tokens outside the draft vocabulary |")
        print("|---|---|---|---|---|---|---|")
        for name, values in results.items():
            m = {k: statistics.median(v) for k, v in values.items()}
            print(f"| {name} | {m['alpha']:.2f} | {m['tau']:.2f} | {m['draft_ms']:.1f} | {m['speed']:.1f} | {m['ratio']:.2f} | "
                  f"{m['uncovered']:.1%} |", flush=True)


if __name__ == "__main__":
    main()
