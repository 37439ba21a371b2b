"""Speculative decoding with the int4 target's verification on AMX tiles against the VNNI path, in one process:
per prompt, plain decoding, then each configuration with the 4-bit AMX threshold on (``--amx-rows``) and off
(0), in alternating order (the same output bits either way: every output is checked identical to plain).

    .venv/bin/python benchmarks/spec_amx_ab.py --limit 6 --configs draft_model:4,draft_model:8,draft_model:auto

Prints per group and configuration the medians over prompts of decode tokens/s with AMX, the per-prompt ratio
AMX ÷ VNNI (then its median and range), τ (mean accepted length) and the target's verify ms per round.
Needs a CPU whose 4-bit layers run on AMX here (``kernel().q4_amx_min_rows() > 0``).
"""

from __future__ import annotations

import argparse
import statistics

from interleaved import add_pair_args, group_prompts, header, load_pair

import specdec
from specdec.drafters.suffix import clear_global_caches
from specdec.kernels.build import kernel, use_q4_amx_rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(parser)
    parser.add_argument("--configs", default="draft_model:4,draft_model:8,draft_model:auto",
                        help="method:γ pairs (γ a number or auto), comma-separated")
    parser.add_argument("--spec-tree", default="off", help="--spec-tree for every configuration (off, auto or N)")
    parser.add_argument("--amx-rows", type=int, default=8, help="the AMX threshold of the 'on' runs")
    args = parser.parse_args()
    if not kernel().q4_amx_min_rows():
        parser.error("the 4-bit layers do not run on AMX here (no AMX, another kernel path, or SPECDEC_Q4_AMX_ROWS=0)")
    target, draft = load_pair(args)
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    configs = [tuple(c.split(":")) for c in args.configs.split(",")]
    print(header(args, f"tree {args.spec_tree}; AMX from {args.amx_rows} rows vs VNNI, alternating per prompt"), flush=True)
    print("| group | config | AMX decode tok/s | VNNI decode tok/s | AMX ÷ VNNI (median, range) | τ AMX / VNNI | "
          "verify ms/round AMX / VNNI |\n|---|---|---|---|---|---|---|")
    for group, prompt_ids in group_prompts(target, args):
        rows: dict[str, list[tuple[float, ...]]] = {}
        for number, ids in enumerate(prompt_ids):
            plain = specdec.generate(target, ids, params).token_ids
            for method, gamma in configs:
                spec = specdec.SpecConfig(method=method, num_speculative_tokens=gamma if gamma == "auto" else int(gamma),
                                          spec_tree=args.spec_tree)
                runs = {}
                for amx in ((True, False) if number % 2 == 0 else (False, True)):
                    clear_global_caches()
                    with use_q4_amx_rows(args.amx_rows if amx else 0):
                        out = specdec.generate(target, ids, params, draft=draft, spec=spec)
                    if out.token_ids != plain:
                        print(f"MISMATCH {method}:{gamma} amx={amx} on {group} prompt {number}", flush=True)
                    s = out.stats
                    runs[amx] = (s.tokens_per_s, s.mean_accepted_len, 1e3 * s.verify_time_s / max(s.target_forwards, 1))
                rows.setdefault(f"{method}:{gamma}", []).append(
                    (runs[True][0], runs[False][0], runs[True][0] / runs[False][0], runs[True][1], runs[False][1],
                     runs[True][2], runs[False][2]))
        for name, values in rows.items():
            m = [statistics.median(column) for column in zip(*values)]
            ratios = [v[2] for v in values]
            print(f"| {group} | {name} | {m[0]:.1f} | {m[1]:.1f} | {m[2]:.3f} ({min(ratios):.2f}–{max(ratios):.2f}) | "
                  f"{m[3]:.2f} / {m[4]:.2f} | {m[5]:.1f} / {m[6]:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
