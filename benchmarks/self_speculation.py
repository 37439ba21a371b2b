"""Self-speculation (early exit at several L, calibrated layer skip) vs plain decoding, same run.

HumanEval and Spec-Bench mt_bench prompts, greedy, the default target; configurations interleaved
per prompt, median of ``--repeats``. Prints speedup, α, τ and the measured draft/target cost ratio c,
with the break-even α each c needs at that γ, so a missing speedup shows its reason: at cost ratio c
and γ drafted tokens a step costs (1 + γc) target-forward times and yields (1 − α^(γ+1))/(1 − α)
tokens. The layer-skip set is the one saved by `specdec calibrate-skip` (run it first), else the default.

    .venv/bin/python benchmarks/self_speculation.py --prompts 2 --max-tokens 64 --exit-layers 8,14,20,24 --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
from specdec.adaptive import expected_tokens  # noqa: E402
from specdec.api import encode_prompt  # noqa: E402
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.drafters.layer_skip import load_calibration  # noqa: E402


def expected_speedup(alpha: float, gamma: float, cost_ratio: float) -> float:
    """Leviathan et al. eq. 1: tokens per step / cost per step, in target-forward units."""
    return expected_tokens(alpha, gamma) / (1 + gamma * cost_ratio)


def break_even_alpha(gamma: int, cost_ratio: float) -> float:
    """Smallest α with expected_speedup ≥ 1 (bisection)."""
    low, high = 0.0, 1.0
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_speedup(mid, gamma, cost_ratio) < 1 else (low, mid)
    return high


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--quantize", default="int8", choices=["int8", "none"])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompts", type=int, default=2, help="per dataset (HumanEval, mt_bench)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--exit-layers", default="8,14,20,24")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    target = specdec.load_model(args.model, args.dtype, "cpu", quantize=args.quantize)
    rows = load_prompts("humaneval", limit=args.prompts) + load_prompts("spec_bench", categories=["mt_bench"], limit=args.prompts)
    prompts = [(row.category, encode_prompt(target, row.turns[0], chat=row.chat)) for row in rows]
    calibration = load_calibration(target.path, target.backend.dtype_name)
    skip = calibration["skip_layers"] if calibration else None
    configs: dict[str, specdec.SpecConfig | None] = {"plain": None}
    for layer in (int(x) for x in args.exit_layers.split(",")):
        configs[f"early-exit L={layer}"] = specdec.SpecConfig(method="early_exit", exit_layer=layer, num_speculative_tokens=args.gamma)
    label = f"layer-skip {'calibrated' if skip else 'default'} (skip {len(skip) if skip else 'default'})"
    configs[label] = specdec.SpecConfig(method="layer_skip", skip_layers=skip, num_speculative_tokens=args.gamma)

    print(f"# {args.model}, {target.backend.dtype_name}, {target.config.num_layers} layers, {torch.get_num_threads()} threads, "
          f"{len(prompts)} prompts (HumanEval + mt_bench) × {args.max_tokens} tokens, greedy, γ={args.gamma}, "
          f"median of {args.repeats}, interleaved per prompt")
    if calibration:
        print(f"calibration: skip {calibration['skip_layers']} → {calibration['tokens_per_s']} tok/s vs plain "
              f"{calibration['plain_tokens_per_s']} ({calibration['speedup']}×), α={calibration['acceptance_rate']}, "
              f"{len(calibration['trials'])} trials on {calibration.get('dataset')}")
    results: dict[str, list[specdec.Stats]] = {name: [] for name in configs}
    identical = {name: True for name in configs}
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    for index, (_, ids) in enumerate(prompts):
        for _ in range(args.repeats):
            plain_ids = None
            for name, spec in configs.items():
                out = specdec.generate(target, ids, params, spec=spec)
                if spec is None:
                    plain_ids = out.token_ids
                elif out.token_ids != plain_ids:
                    identical[name] = False
                results[name].append(out.stats)
        print(f"  prompt {index + 1}/{len(prompts)} done", file=sys.stderr, flush=True)

    plain = statistics.median(s.tokens_per_s for s in results["plain"])
    print("\n| config | tok/s | speedup | α | τ | cost ratio c | break-even α at γ, c | model-predicted speedup | identical |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, stats in results.items():
        tps = statistics.median(s.tokens_per_s for s in stats)
        if configs[name] is None:
            print(f"| {name} | {tps:.2f} | 1.00× | | | | | | |")
            continue
        alpha = statistics.median(s.acceptance_rate for s in stats)
        tau = statistics.median(s.mean_accepted_len for s in stats)
        cost = statistics.median(s.draft_cost_ratio for s in stats)
        print(f"| {name} | {tps:.2f} | {tps / plain:.2f}× | {alpha:.2f} | {tau:.2f} | {cost:.2f} | "
              f"{break_even_alpha(args.gamma, cost):.2f} | {expected_speedup(alpha, args.gamma, cost):.2f}× | "
              f"{'yes' if identical[name] else '**NO**'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
