"""End to end: plain and speculative decoding with the models on transparent huge pages (as every CPU model is
loaded now, and their requests' KV caches: specdec/huge_pages.py) against the same models and caches on 4 KiB
pages, in one process — both pairs loaded (the 4 KiB pair with ``SPECDEC_HUGE_PAGES=0``, also set while it
generates), per prompt each configuration on both, in alternating order.
Every output is checked identical to plain decoding (the move changes where weights live, not their bits).

    .venv/bin/python benchmarks/huge_pages_e2e.py --groups humaneval,mt_bench --limit 6 \\
        --configs plain,draft_model:4,draft_suffix:auto

Prints per group and configuration the medians over prompts of decode tokens/s on huge and 4 KiB pages and of
the per-prompt ratio huge ÷ 4 KiB (with its range), and for speculative ones each pair's speedup over its own
plain decoding.
"""

from __future__ import annotations

import argparse
import os
import statistics

from interleaved import add_pair_args, group_prompts, header, load_pair

import specdec
from specdec.drafters.suffix import clear_global_caches
from specdec.huge_pages import huge_pages_supported


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(parser)
    parser.add_argument("--configs", default="plain,draft_model:4,draft_suffix:auto",
                        help="method:γ pairs (γ a number or auto), comma-separated; plain decoding always runs first")
    parser.add_argument("--spec-tree", default=None, help="--spec-tree for every speculative configuration "
                        "(default: the library's; off holds both pairs to the same chains)")
    args = parser.parse_args()
    if not huge_pages_supported():
        parser.error("no transparent huge pages here (or SPECDEC_HUGE_PAGES=0): nothing to compare")
    os.environ["SPECDEC_HUGE_PAGES"] = "0"
    small_pair = load_pair(args)
    os.environ["SPECDEC_HUGE_PAGES"] = "1"
    huge_pair = load_pair(args)
    pairs = {"huge": huge_pair, "4k": small_pair}
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    configs = ["plain"] + [c for c in args.configs.split(",") if c != "plain"]  # plain first: the reference
    print(header(args, f"tree {args.spec_tree or 'default'}; huge pages vs 4 KiB pages, alternating per prompt"), flush=True)
    print("| group | config | huge decode tok/s | 4 KiB decode tok/s | huge ÷ 4 KiB (median, range) | "
          "× plain huge / 4 KiB |\n|---|---|---|---|---|---|")
    for group, prompt_ids in group_prompts(huge_pair[0], args):
        rows: dict[str, list[dict[str, float]]] = {}
        for number, ids in enumerate(prompt_ids):
            plain_ids = None
            rates: dict[str, dict[str, float]] = {}
            for config in configs:
                spec = None
                if config != "plain":
                    method, gamma = config.split(":")
                    tree = {} if args.spec_tree is None else {"spec_tree": args.spec_tree}
                    spec = specdec.SpecConfig(method=method, num_speculative_tokens=gamma if gamma == "auto" else int(gamma),
                                              **tree)
                for name in (("huge", "4k") if number % 2 == 0 else ("4k", "huge")):
                    target, draft = pairs[name]
                    clear_global_caches()
                    os.environ["SPECDEC_HUGE_PAGES"] = "1" if name == "huge" else "0"  # the requests' KV caches too
                    out = specdec.generate(target, ids, params, draft=draft if spec else None, spec=spec)
                    plain_ids = plain_ids or out.token_ids
                    if out.token_ids != plain_ids:
                        print(f"MISMATCH {config} on {name} pages, {group} prompt {number}", flush=True)
                    rates.setdefault(config, {})[name] = out.stats.tokens_per_s
            for config, rate in rates.items():
                rows.setdefault(config, []).append({**rate, "ratio": rate["huge"] / rate["4k"],
                                                    "x_huge": rate["huge"] / rates["plain"]["huge"],
                                                    "x_4k": rate["4k"] / rates["plain"]["4k"]})
        for config, values in rows.items():
            med = {key: statistics.median(v[key] for v in values) for key in values[0]}
            ratios = [v["ratio"] for v in values]
            print(f"| {group} | {config} | {med['huge']:.1f} | {med['4k']:.1f} | {med['ratio']:.3f} "
                  f"({min(ratios):.2f}–{max(ratios):.2f}) | {med['x_huge']:.2f} / {med['x_4k']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
