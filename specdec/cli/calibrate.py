"""``specdec calibrate-skip``: find which layers ``--method layer-skip`` should skip on this machine,
by measured tokens/s — plain decoding and up to ``--budget`` skip sets (structured seeds, then a local
search) on a few greedy calibration prompts; the fastest set is saved beside the model for
``--skip-layers auto``, unless an earlier run measured a higher speedup. The search is :mod:`specdec.calibrate`."""

from __future__ import annotations

import argparse
import sys

from specdec.cli.common import add_debug_flag, add_model_args
from specdec.cli.values import positive_int


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    cal = subparsers.add_parser("calibrate-skip", help="search which layers --method layer-skip should skip, by measured tokens/s",
                                description="Time plain decoding and up to --budget skip sets (structured seeds, then a local "
                                            "search) on calibration prompts, greedy, and save the fastest set for --skip-layers auto.")
    flags = add_model_args(cal, unused=("--draft-model", "--method", "--skip-layers", "--exit-layer", "--draft-vocab-size",
                                        "--draft-context-window", "--datastore", "--prompt-lookup-min", "--prompt-lookup-max",
                                        "--draft-confidence-threshold", "--draft-quantize", "--drafter-path", "--spec-tree"))
    flags["--num-speculative-tokens"].help = "γ of every trial (default: auto, measured as 4, as any 'auto')"
    cal.add_argument("--dataset", default="humaneval", help="calibration prompts: spec_bench, humaneval, gsm8k or a JSONL (default: humaneval)")
    cal.add_argument("--categories", default=None, help="comma-separated categories of the dataset (e.g. mt_bench; default: all)")
    cal.add_argument("--limit", "--prompts", dest="prompts", type=positive_int, default=2,
                     help="calibration prompts: the first N of --dataset, as bench's and tune's --limit (default: 2)")
    cal.add_argument("--max-tokens", type=positive_int, default=48, help="tokens generated per prompt and trial (default: 48)")
    cal.add_argument("--budget", type=positive_int, default=16, help="skip sets to measure (default: 16)")
    cal.add_argument("--seed", type=int, default=0, help="seed of the local search (default: 0)")
    cal.add_argument("--overwrite", action="store_true",
                     help="save this run's set even when the saved calibration measured a higher speedup (by default "
                          "the faster one is kept, so a quick re-run does not replace a thorough search)")
    add_debug_flag(cal)
    cal.set_defaults(func=run)
    return cal


def run(args: argparse.Namespace) -> int:
    import specdec
    from specdec.api import encode_prompt
    from specdec.bench.datasets import load_prompts
    from specdec.calibrate import calibrate_skip, save_calibration
    from specdec.drafters.layer_skip import calibration_path, load_calibration

    gamma = args.num_speculative_tokens if isinstance(args.num_speculative_tokens, int) else 4
    categories = args.categories.split(",") if args.categories else None
    rows = load_prompts(args.dataset, categories=categories, limit=args.prompts)[: args.prompts]
    print(f"loading {args.model} …", file=sys.stderr)
    target = specdec.load_model(args.model, args.dtype, args.device, auto_pull=not args.no_pull, progress=True, quantize=args.quantize,
                                prompt_quantize=args.prompt_quantize)
    prompts = [encode_prompt(target, row.first_prompt(), chat=row.chat) for row in rows]
    layers = target.config.num_layers
    print(f"{target.backend.dtype_name}, {layers} layers, {len(prompts)} prompts × {args.max_tokens} tokens, γ={gamma}, budget {args.budget}",
          file=sys.stderr)

    def report(trial, index: int) -> None:  # noqa: ANN001
        print(f"[{index}/{args.budget}] skip {trial.skip_layers}: {trial.tokens_per_s:.2f} tok/s, α={trial.acceptance_rate:.2f}, "
              f"τ={trial.mean_accepted_len:.2f}, draft cost ratio {trial.draft_cost_ratio:.2f}", file=sys.stderr)

    result = calibrate_skip(target, prompts, args.max_tokens, gamma, args.budget, args.seed, report)
    best = result.to_dict()
    print(f"plain {best['plain_tokens_per_s']:.2f} tok/s; best skip {best['skip_layers']}: {best['tokens_per_s']:.2f} tok/s "
          f"({best['speedup']:.2f}×, α={best['acceptance_rate']:.2f}, cost ratio {best['draft_cost_ratio']:.2f})")
    if best["speedup"] < 1:
        print(f"warning: no skip set beat plain decoding here (best {best['speedup']:.2f}×): --method layer-skip would slow "
              "this model down on this machine; prefer plain decoding or another method (`specdec tune`)", file=sys.stderr)
    earlier = load_calibration(target.path, target.backend.dtype_name)
    if earlier is not None and not args.overwrite and float(earlier.get("speedup", 0)) >= best["speedup"]:
        print(f"kept the saved calibration {calibration_path(target.path, target.backend.dtype_name)}: skip "
              f"{earlier['skip_layers']} measured {float(earlier['speedup']):.2f}× ({earlier.get('created', 'undated')}), "
              f"this run's best {best['speedup']:.2f}× (--overwrite replaces it)")
        return 0
    path = save_calibration(result, target.path, target.backend.dtype_name,
                            {"dataset": args.dataset, "prompts": len(prompts), "max_tokens": args.max_tokens, "gamma": gamma})
    print(f"saved {path}  (" + ("use: --method layer-skip --skip-layers auto)" if best["speedup"] >= 1 else
                                "--skip-layers auto reads it; plain decoding is faster here: see the warning)"))
    return 0
