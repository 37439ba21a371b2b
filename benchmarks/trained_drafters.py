"""Trained heads vs the 0.5B draft model (issue 23): τ, α, draft cost per token (÷ a target step)
and decode speed against plain decoding of the same target, configurations interleaved per prompt,
greedy chains of γ, every output checked identical to plain decoding.

    .venv/bin/python benchmarks/trained_drafters.py --eagle DIR [--medusa DIR] --groups humaneval,mt_bench --limit 6

The heads were trained on the Python standard library's sources (`specdec train-drafter`): HumanEval
and MT-Bench prompts are held out by construction. Prints per group the medians over prompts; the CPU
flags go in the header so results from different machines are not mixed up.
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
from specdec.cpu import cpu_description  # noqa: E402

GROUPS = {"humaneval": ("humaneval", None), "mt_bench": ("spec_bench", ["mt_bench"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--quantize", default="int8", help="target execution mode (default: int8, what the heads' features came from)")
    parser.add_argument("--eagle", action="append", default=[], metavar="DIR",
                        help="a trained eagle head (repeat to compare heads in one run: rows named by directory)")
    parser.add_argument("--medusa", action="append", default=[], metavar="DIR",
                        help="trained medusa heads (repeatable, as --eagle)")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b", help="the baseline drafter ('' to skip)")
    parser.add_argument("--draft-quantize", default="int4-all")
    parser.add_argument("--distilled", default=None, metavar="DIR",
                        help="a distilled draft (train-drafter --kind distill) run beside --draft-model; compare both at "
                             "--draft-quantize int8 (a GGUF's int4 keeps its own 4-bit blocks, a directory is rounded from float)")
    parser.add_argument("--groups", default="humaneval,mt_bench", help=f"prompt groups: {', '.join(GROUPS)}")
    parser.add_argument("--limit", type=int, default=6, help="prompts per group")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4, help="γ of the draft model and of the heads")
    parser.add_argument("--head-gammas", default="", help="more γ for the heads, comma-separated (e.g. 1,2,auto)")
    parser.add_argument("--tree", nargs="?", const="auto", default="", metavar="BUDGETS",
                        help="also the heads at γ as token trees (EAGLE-2 trees; Medusa's per-block branching), one row "
                             "per --spec-tree budget, comma-separated: auto (the verification costs decide; the "
                             "default when the flag is bare) or a node count, e.g. --tree auto,8")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = specdec.load_model(args.model, quantize=args.quantize)
    drafts = {name: specdec.load_model(path, quantize=args.draft_quantize)
              for name, path in (("draft_model", args.draft_model), ("distilled", args.distilled)) if path}
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    plan: dict[str, specdec.SpecConfig | None] = {"plain": None}
    head_gammas = [args.gamma, *(g.strip() if g.strip() == "auto" else int(g) for g in args.head_gammas.split(",") if g.strip())]
    for method, paths in (("eagle", args.eagle), ("medusa", args.medusa)):
        for path in paths:
            label = method if len(paths) == 1 else f"{method} {Path(path).name}"
            for gamma in head_gammas:
                plan[f"{label} γ={gamma}"] = specdec.SpecConfig(method=method, drafter_path=path, num_speculative_tokens=gamma)
            for budget in (b.strip() for b in args.tree.split(",") if b.strip()):
                name = f"{label} γ={args.gamma} tree" + ("" if budget == "auto" else f" {budget}")
                plan[name] = specdec.SpecConfig(method=method, drafter_path=path, num_speculative_tokens=args.gamma,
                                                spec_tree=budget)
    draft_of: dict[str, specdec.LoadedModel] = {}
    for name, loaded in drafts.items():
        plan[f"{name} γ={args.gamma}"] = specdec.SpecConfig(method="draft_model", num_speculative_tokens=args.gamma)
        draft_of[f"{name} γ={args.gamma}"] = loaded
    print(f"# {args.model} {args.quantize}" + "".join(f" + {name} {args.draft_quantize}" for name in drafts)
          + f"; CPU: {cpu_description()}; {args.threads} threads; greedy, {args.max_tokens} tokens, γ={args.gamma}", flush=True)
    for group in args.groups.split(","):
        dataset, categories = GROUPS[group]
        rows = load_prompts(dataset, categories, args.limit)
        results: dict[str, dict[str, list[float]]] = {name: {} for name in plan}
        for row in rows:
            ids = specdec.api.encode_prompt(target, row.turns[0], chat=row.chat)
            plain_tokens, plain_speed = None, 1.0
            for name, spec in plan.items():
                out = specdec.generate(target, ids, params, draft=draft_of.get(name), spec=spec)
                s = out.stats
                speed = (s.generated_tokens - 1) / s.decode_time_s
                if spec is None:
                    plain_tokens, plain_speed = out.token_ids, speed
                elif out.token_ids != plain_tokens:
                    print(f"MISMATCH {name} on {row.id}", flush=True)
                values = {"tau": s.mean_accepted_len, "alpha": s.acceptance_rate, "cost": s.draft_cost_ratio,
                          "speed": speed, "ratio": speed / plain_speed, "gbs": s.achieved_gb_per_s}
                for key, value in values.items():
                    results[name].setdefault(key, []).append(value)
            print(f"  {group} {row.id}: done", flush=True)
        print(f"\n## {group} ({len(rows)} prompts, medians)\n")
        print("| config | τ | α | draft cost ÷ target step | decode tok/s | × plain | GB/s |")
        print("|---|---|---|---|---|---|---|")
        for name, values in results.items():
            m = {k: statistics.median(v) for k, v in values.items()}
            print(f"| {name} | {m['tau']:.2f} | {m['alpha']:.2f} | {m['cost']:.3f} | {m['speed']:.1f} | {m['ratio']:.2f} | "
                  f"{m['gbs']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
