"""γ=auto planning from the probe's cached curve alone ("probe") vs rescaled by the loaded models'
timed forwards ("timed", :mod:`specdec.step_calibration`, what load_model does now): plain decoding,
then each method in both arms, interleaved per prompt in one process (the same moment of the
machine for both), greedy, every output checked identical to plain decoding. Suffix caches are
cleared before every run.

    .venv/bin/python benchmarks/step_calibration_ab.py --limit 6 --methods draft_model,draft_suffix

Prints the ratios the calibration found, then per group and configuration the medians over prompts
of end-to-end tokens/s (prompt included), its ratio to plain (per prompt, then the median), α and the
tokens drafted per request.
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
    parser.add_argument("--methods", default="draft_model,draft_suffix")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every configuration per prompt (median)")
    args = parser.parse_args()
    target, draft = load_pair(args)
    timed = {model.name: dict(model.backend.step_ratios) for model in (target, draft)}
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    plan: dict[str, tuple[str | None, bool]] = {"plain": (None, True)}
    for method in args.methods.split(","):
        plan[f"{method} probe"] = (method, False)
        plan[f"{method} timed"] = (method, True)
    print(header(args, "γ=auto"), flush=True)
    for name, ratios in timed.items():
        print(f"timed ÷ probe, {name}: " + ", ".join(f"T={t} {r:.2f}" for t, r in ratios.items()), flush=True)
    print("| group | config | e2e tok/s | × plain | α | tokens drafted |\n|---|---|---|---|---|---|")
    for group, prompt_ids in group_prompts(target, args):
        results: dict[str, list[tuple[float, ...]]] = {}
        for number, ids in enumerate(prompt_ids):
            runs: dict[str, list[tuple[float, ...]]] = {}
            plain_tokens = None
            for _ in range(args.repeats):
                for name, (method, calibrated) in plan.items():
                    for model in (target, draft):
                        model.backend.step_ratios = timed[model.name] if calibrated else {}
                    clear_global_caches()
                    spec = None if method is None else specdec.SpecConfig(method=method, num_speculative_tokens="auto")
                    out = specdec.generate(target, ids, params, draft=None if spec is None else draft, spec=spec)
                    s = out.stats
                    if spec is None:
                        plain_tokens = out.token_ids
                    elif out.token_ids != plain_tokens:
                        print(f"MISMATCH {name} on {group} prompt {number}", flush=True)
                    runs.setdefault(name, []).append((s.generated_tokens / s.total_time_s, s.acceptance_rate, s.proposed_tokens))
            plain_speed = statistics.median(r[0] for r in runs["plain"])
            for name, values in runs.items():
                speed = statistics.median(v[0] for v in values)
                results.setdefault(name, []).append((speed, speed / plain_speed, values[0][1], values[0][2]))
        for name, values in results.items():
            m = [statistics.median(column) for column in zip(*values)]
            print(f"| {group} | {name} | {m[0]:.1f} | {m[1]:.2f} | {m[2]:.2f} | {m[3]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
