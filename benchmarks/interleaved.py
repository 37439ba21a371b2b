"""Shared by the benchmarks that run a target and a draft model over prompt groups, configurations
interleaved per prompt (draft_vocab.py, draft_window.py, gamma_*.py): the groups, the model flags, loading."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402

#: group name → (dataset, categories) for load_prompts
GROUPS = {"humaneval": ("humaneval", None), "gsm8k": ("gsm8k", None), "mt_bench": ("spec_bench", ["mt_bench"]),
          "summarization": ("spec_bench", ["summarization"]), "rag": ("spec_bench", ["rag"])}  # (long prompts: 600-900 tokens)


def add_pair_args(parser: argparse.ArgumentParser) -> None:
    """The target / draft / execution-mode / group flags every such benchmark takes."""
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--quantize", default="int4", help="target execution mode (default: int4, what generate picks here)")
    parser.add_argument("--prompt-quantize", default="auto")
    parser.add_argument("--draft-quantize", default="int4-all")
    parser.add_argument("--groups", default="humaneval,gsm8k,mt_bench",
                        help=f"prompt groups: {', '.join(GROUPS)}, or a JSONL file of your own prompts "
                             "(as `specdec bench --dataset FILE`: one group, named after the file)")
    parser.add_argument("--limit", type=int, default=6, help="prompts per group")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)


def load_pair(args: argparse.Namespace) -> tuple[specdec.LoadedModel, specdec.LoadedModel]:
    torch.set_num_threads(args.threads)
    target = specdec.load_model(args.model, quantize=args.quantize, prompt_quantize=args.prompt_quantize)
    draft = specdec.load_model(args.draft_model, quantize=args.draft_quantize, prompt_quantize=args.prompt_quantize)
    return target, draft


def header(args: argparse.Namespace, what: str) -> str:
    """The first line of a result file: the models, their modes and this CPU's flags."""
    return (f"# {args.model} {args.quantize} (prompts {args.prompt_quantize}) + {args.draft_model} {args.draft_quantize}; "
            f"CPU: {cpu_description()}; {args.threads} threads; greedy, {args.max_tokens} tokens, {what}")


def group_prompts(target: specdec.LoadedModel, args: argparse.Namespace) -> Iterator[tuple[str, list[list[int]]]]:
    """(group, its prompts as token ids — chat ones through the chat template) for each of --groups."""
    for group in args.groups.split(","):
        if group not in GROUPS and not Path(group).is_file():
            raise SystemExit(f"--groups {group}: not one of {', '.join(GROUPS)} and not a file")
        dataset, categories = GROUPS.get(group, (group, None))
        rows = load_prompts(dataset, categories, args.limit)
        yield Path(group).stem, [specdec.api.encode_prompt(target, row.turns[0], chat=row.chat) for row in rows]


#: one prompt's run of one configuration: (end-to-end tokens/s, that ÷ the prompt's plain run, its result)
Run = tuple[float, float, "specdec.api.GenerationResult"]


def compare_to_plain(target: specdec.LoadedModel, draft: specdec.LoadedModel, args: argparse.Namespace,
                     plan: dict[str, "specdec.SpecConfig | None"],
                     before: Callable[[str], None] | None = None) -> Iterator[tuple[str, dict[str, list[Run]]]]:
    """Per group of --groups, each configuration's runs (``plan``: name → spec; the first one None, plain
    decoding, which every later run is timed against and must equal token for token), interleaved per
    prompt, greedy, --max-tokens each; suffix caches cleared and ``before(name)`` called before every run."""
    from specdec.drafters.suffix import clear_global_caches

    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    for group, prompt_ids in group_prompts(target, args):
        results: dict[str, list[Run]] = {}
        for number, ids in enumerate(prompt_ids):
            plain_speed, plain_tokens = 0.0, None
            for name, spec in plan.items():
                if before is not None:
                    before(name)
                clear_global_caches()
                out = specdec.generate(target, ids, params, draft=None if spec is None else draft, spec=spec)
                speed = out.stats.generated_tokens / out.stats.total_time_s
                if spec is None:
                    plain_speed, plain_tokens = speed, out.token_ids
                elif out.token_ids != plain_tokens:
                    print(f"MISMATCH {name} on {group} prompt {number}", flush=True)
                results.setdefault(name, []).append((speed, speed / plain_speed, out))
        yield group, results


def variant_row(group: str, variant: str, results: dict[str, list[Run]], repeats: int) -> str:
    """One table row for the runs named ``variant#r`` (r < repeats): medians over prompts (of each prompt's median
    over repeats) of end-to-end tokens/s and its ratio to plain, median τ, the draft model's forwards and rounds."""
    import statistics

    runs = [run for name, rs in results.items() if name.startswith(variant) for run in rs]
    prompts = len(runs) // repeats
    by_prompt = [[runs[r * prompts + p] for r in range(repeats)] for p in range(prompts)]
    speed = statistics.median(statistics.median(s for s, _, _ in runs_) for runs_ in by_prompt)
    ratio = statistics.median(statistics.median(r for _, r, _ in runs_) for runs_ in by_prompt)
    tau = statistics.median(out.stats.mean_accepted_len for _, _, out in runs)
    forwards = statistics.median(out.stats.draft_forwards or 0 for _, _, out in runs)
    rounds = statistics.median(len(out.stats.rounds) for _, _, out in runs)
    return f"| {group} | {variant} | {speed:.1f} | {ratio:.2f} | {tau:.2f} | {forwards:.0f} / {rounds:.0f} |"


def old_new_main(doc: str, method: str, what: str, use_old: Callable[[bool], None]) -> None:
    """A one-off A/B of a code change: plain decoding, then ``method`` as "old" and "new" alternately (--repeats
    each), interleaved per prompt; ``use_old(True|False)`` switches the code before each run. Prints a table of
    :func:`variant_row` per group."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(parser)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    target, draft = load_pair(args)
    plan: dict[str, specdec.SpecConfig | None] = {"plain": None}
    for repeat in range(args.repeats):
        for variant in ("old", "new"):
            plan[f"{variant}#{repeat}"] = specdec.SpecConfig(method=method)
    print(header(args, what), flush=True)
    print("| group | variant | e2e tok/s | × plain | τ | draft-model forwards / rounds |\n|---|---|---|---|---|---|")
    for group, results in compare_to_plain(target, draft, args, plan, lambda name: use_old(name.startswith("old"))):
        for variant in ("old", "new"):
            print(variant_row(group, variant, results, args.repeats), flush=True)
