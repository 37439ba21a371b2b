"""Which target execution pays most for draft-model speculation: int8 (flat verification cost) or
int4 (faster single steps, verification cost growing per token)? One run, same prompts, same int4
draft, every speculative output checked against plain decoding of the same target.

    .venv/bin/python benchmarks/draft_target_modes.py --prompts 4 --max-tokens 128

Prints tokens/s (as the stats line reports them) and ratios to each mode's plain decoding.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.drafters.suffix import clear_global_caches  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--modes", default="int8,int4", help="target execution modes, comma-separated")
    parser.add_argument("--prompts", type=int, default=4, help="HumanEval prompts")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--draft-quantize", default="int4", help="the draft's mode (make run's: int4-all)")
    parser.add_argument("--prompt-quantize", default="same", help="the targets' prompt mode (generate's default: auto)")
    parser.add_argument("--method", default="draft_model", help="draft_model or draft_suffix (make run's)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    modes = args.modes.split(",")
    targets = {mode: specdec.load_model(args.model, quantize=mode, prompt_quantize=args.prompt_quantize) for mode in modes}
    draft = specdec.load_model(args.draft_model, quantize=args.draft_quantize)
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    configs = {"plain": None, f"{args.method} γ=4": specdec.SpecConfig(method=args.method, num_speculative_tokens=4),
               f"{args.method} γ=auto": specdec.SpecConfig(method=args.method, num_speculative_tokens="auto")}
    rates: dict[tuple[str, str], list[float]] = {}
    for row in load_prompts("humaneval", limit=args.prompts):
        for mode, target in targets.items():  # interleaved per prompt
            plain: list[int] | None = None
            for label, spec in configs.items():
                # every run starts as a new process would: no earlier answer in the suffix cache (the same
                # prompt's answer from the previous config would be drafted back whole)
                clear_global_caches()
                out = specdec.generate(target, row.turns[0], params, chat=row.chat, draft=draft if spec else None, spec=spec)
                if spec is None:
                    plain = out.token_ids
                elif out.token_ids != plain:
                    raise SystemExit(f"{mode} {label}: speculative output differs from plain decoding on {row.id}")
                rates.setdefault((mode, label), []).append(out.stats.tokens_per_s)
        print(f"  {row.id} done", file=sys.stderr)
    plain_rate = {mode: statistics.median(rates[(mode, "plain")]) for mode in modes}
    from specdec.cpu import cpu_description

    print(f"# {args.model} (prompts: {args.prompt_quantize}) ← {args.draft_model} ({args.draft_quantize}), {args.prompts} "
          f"HumanEval prompts × {args.max_tokens} tokens, greedy, medians, modes interleaved per prompt; CPU {cpu_description()}")
    print("| target | config | tok/s | " + " | ".join(f"vs {m} plain" for m in modes) + " |")
    print("|---|---|---|" + "---|" * len(modes))
    for (mode, label), values in rates.items():
        rate = statistics.median(values)
        print(f"| {mode} | {label} | {rate:.2f} | " + " | ".join(f"{rate / plain_rate[m]:.2f}×" for m in modes) + " |")


if __name__ == "__main__":
    main()
