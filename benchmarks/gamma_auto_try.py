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
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
from specdec import adaptive  # noqa: E402
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402
from specdec.drafters.suffix import clear_global_caches  # noqa: E402

GROUPS = {"humaneval": ("humaneval", None), "mt_bench": ("spec_bench", ["mt_bench"]), "gsm8k": ("gsm8k", None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--quantize", default="int4")
    parser.add_argument("--prompt-quantize", default="auto")
    parser.add_argument("--draft-quantize", default="int4-all")
    parser.add_argument("--groups", default="humaneval,mt_bench,gsm8k", help=f"prompt groups: {', '.join(GROUPS)}")
    parser.add_argument("--methods", default="draft_model,draft_suffix")
    parser.add_argument("--limit", type=int, default=6, help="prompts per group")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = specdec.load_model(args.model, quantize=args.quantize, prompt_quantize=args.prompt_quantize)
    draft = specdec.load_model(args.draft_model, quantize=args.draft_quantize, prompt_quantize=args.prompt_quantize)
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    optimistic = adaptive.OPTIMISTIC_ALPHA
    plan: dict[str, tuple[str | None, float]] = {"plain": (None, optimistic)}
    for method in args.methods.split(","):
        plan[f"{method} old"] = (method, 0.0)
        plan[f"{method} new"] = (method, optimistic)
    print(f"# {args.model} {args.quantize} (prompts {args.prompt_quantize}) + {args.draft_model} {args.draft_quantize}; "
          f"CPU: {cpu_description()}; {args.threads} threads; greedy, {args.max_tokens} tokens, γ=auto", flush=True)
    print("| group | config | e2e tok/s | × plain | α | tokens drafted |\n|---|---|---|---|---|---|")
    for group in args.groups.split(","):
        dataset, categories = GROUPS[group]
        results: dict[str, list[tuple[float, ...]]] = {}
        for row in load_prompts(dataset, categories, args.limit):
            ids = specdec.api.encode_prompt(target, row.turns[0], chat=row.chat)
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
                    print(f"MISMATCH {name} on {row.id}", flush=True)
                results.setdefault(name, []).append((speed, speed / plain_speed, s.acceptance_rate, s.proposed_tokens))
        adaptive.OPTIMISTIC_ALPHA = optimistic
        for name, values in results.items():
            m = [statistics.median(column) for column in zip(*values)]
            print(f"| {group} | {name} | {m[0]:.1f} | {m[1]:.2f} | {m[2]:.2f} | {m[3]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
