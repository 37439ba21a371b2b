"""Token trees vs chains (issue 22): τ (tokens per target forward) and decode speed of each drafter
with chains and with trees, against plain decoding of the same target, configurations interleaved
per prompt. Greedy by default (every output checked identical to plain decoding); ``--temperature T``
measures sampled decoding, where SpecTr's trees are meant to pay (seed 000).

    .venv/bin/python benchmarks/tree_vs_chain.py --groups humaneval,mt_bench --limit 6 --max-tokens 64

"Same verification budget": a chain of γ tokens against a tree of at most γ nodes (``tree=γ``);
``tree=auto`` may verify up to 2γ nodes where the measured verify cost says they pay. Prints per
group and configuration the medians over prompts of τ, decode tok/s and its ratio to plain (per
prompt, then the median), nodes verified per round and the rounds won by a non-first branch. The
CPU flags go in the header so results from different machines are not mixed up.

``--costs flat`` spends the verification budget as on a GPU, where verifying 16 tokens costs ~1.2
single-token steps (benchmarks/results/2026-11-24/cuda_step_cost.md): the verify-cost model is flat
and learns nothing from this CPU's timings (so no chain or tree is cut short because a CPU's wider
forwards cost more), and the draft model's trees forward 4 nodes per level. τ under greedy does not
depend on the device, so this measures on the CPU the τ a GPU run of the same pair would get; the
tok/s columns are this CPU's and mean little then.

``--suffix-history N`` measures suffix decoding where it is meant to run: in a server whose shared
suffix table has seen earlier requests. Before each run the table holds the plain outputs of N other
prompts of the group (after the measured ones in the dataset, disjoint from them) and of the measured
prompts before this one — never this prompt's own output. 0 (default): an empty table per run.

``--temperature T`` (with ``--top-p``): sampled decoding. A chain drafts tokens sampled from the
draft's distribution and accepts each with min(1, p/q); with a tree budget a model drafter's sampled
chain gets the draft's likeliest other tokens as point-mass alternatives (specdec/alternatives.py),
while suffix and n-gram trees stay point masses (exact: the χ² certificate,
``tests/test_tree.py::test_tree_sampling_certificate``). Each configuration runs ``--samples`` seeds
per prompt (the same seeds for every configuration); τ is a random variable then, so read its median
over prompts × seeds. Outputs differ from plain decoding's by design; exactness is the tests' job.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
import specdec.adaptive  # noqa: E402
import specdec.api  # noqa: E402
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402
from specdec.drafters.suffix import clear_global_caches, global_cache_for, vocabulary_key  # noqa: E402

GROUPS = {"humaneval": ("humaneval", None), "mt_bench": ("spec_bench", ["mt_bench"])}
#: a finished request enters the shared suffix table with its prompt's last tokens as context
#: (SuffixDrafter.finish, max_depth 8)
PROMPT_CONTEXT = 8


def configs(methods: list[str], gamma: int) -> dict[str, specdec.SpecConfig | None]:
    result: dict[str, specdec.SpecConfig | None] = {"plain": None}
    for method in methods:
        for tree in ("off", gamma, "auto"):
            label = "chain" if tree == "off" else f"tree={tree}"
            result[f"{method} {label}"] = specdec.SpecConfig(method=method, num_speculative_tokens=gamma, spec_tree=tree)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--quantize", default="int8", help="target execution mode (default: int8, what auto picks on AVX2)")
    parser.add_argument("--draft-quantize", default="int4-all")
    parser.add_argument("--groups", default="humaneval,mt_bench", help=f"prompt groups: {', '.join(GROUPS)}")
    parser.add_argument("--limit", type=int, default=6, help="prompts per group")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4, help="chain length, and the tree=γ budget")
    parser.add_argument("--methods", default="draft_model,suffix,ngram")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--costs", choices=("measured", "flat"), default="measured",
                        help="verify costs the budget is spent by: this machine's measured curve, or flat (a GPU's)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: sampled decoding")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling with --temperature (1 = off)")
    parser.add_argument("--samples", type=int, default=3, help="seeds per prompt and configuration under sampling")
    parser.add_argument("--suffix-history", type=int, default=0, metavar="N",
                        help="the shared suffix table holds the plain outputs of N other prompts of the group and of "
                             "the measured prompts before each one, as a server's would (default: 0, empty)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    methods = args.methods.split(",")
    target = specdec.load_model(args.model, quantize=args.quantize)
    needs_draft = any(specdec.drafters.registry.needs_draft_model(m) for m in methods)
    draft = specdec.load_model(args.draft_model, quantize=args.draft_quantize) if needs_draft else None
    if args.costs == "flat":
        flatten_costs(target, draft)
    greedy = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    seeds = [None] if args.temperature == 0 else list(range(args.samples))
    decoding = "greedy" if args.temperature == 0 else \
        f"temperature {args.temperature}, top-p {args.top_p}, {args.samples} seeds per prompt"
    plan = configs(methods, args.gamma)
    shared_key = vocabulary_key(target.tokenizer, target.config.vocab_size)  # the table the suffix drafter reads
    table = (f"{args.suffix_history} other prompts' outputs + the measured ones before" if args.suffix_history
             else "empty per run")
    print(f"# {args.model} {args.quantize} + {args.draft_model} {args.draft_quantize}; CPU: {cpu_description()}; "
          f"{args.threads} threads; {decoding}, {args.max_tokens} tokens, γ={args.gamma}, {args.costs} verify costs; "
          f"suffix table: {table}",
          flush=True)
    for group in args.groups.split(","):
        dataset, categories = GROUPS[group]
        rows = load_prompts(dataset, categories, args.limit + args.suffix_history)
        rows, history_rows = rows[: args.limit], rows[args.limit :]
        history = [served(target, row, greedy) for row in history_rows]
        results: dict[str, dict[str, list[float]]] = {name: {} for name in plan}
        for row in rows:
            ids = specdec.api.encode_prompt(target, row.turns[0], chat=row.chat)
            for seed in seeds:
                params = greedy if seed is None else dataclasses.replace(
                    greedy, temperature=args.temperature, top_p=args.top_p, seed=seed)
                plain_tokens, plain_speed = None, 1.0
                for name, spec in plan.items():
                    clear_global_caches()  # no request drafts from an earlier run of itself
                    shared = global_cache_for(shared_key)
                    for tokens in history:
                        shared.add_request(tokens)
                    uses_draft = spec is not None and specdec.drafters.registry.needs_draft_model(spec.method)
                    out = specdec.generate(target, ids, params, draft=draft if uses_draft else None, spec=spec)
                    s = out.stats
                    speed = (s.generated_tokens - 1) / s.decode_time_s
                    if spec is None:
                        plain_tokens, plain_speed = out.token_ids, speed
                    elif seed is None and out.token_ids != plain_tokens:
                        print(f"MISMATCH {name} on {row.id}", flush=True)
                    values = {"tau": s.mean_accepted_len, "speed": speed, "ratio": speed / plain_speed,
                              "nodes": s.tree_nodes / s.tree_rounds if s.tree_rounds else s.proposed_tokens / max(s.target_forwards, 1),
                              "wins": s.tree_branch_wins / s.tree_rounds if s.tree_rounds else 0.0,
                              "gbs": s.achieved_gb_per_s,
                              "alt_wins": s.alternative_wins, "alt_promised": s.alternative_promised}
                    for key, value in values.items():
                        results[name].setdefault(key, []).append(value)
                if args.suffix_history and seed == seeds[0]:  # the table sees each prompt once
                    history.append(ids[-PROMPT_CONTEXT:] + plain_tokens)
            print(f"  {group} {row.id}: done", flush=True)
        print(f"\n## {group} ({len(rows)} prompts{'' if seeds == [None] else f' × {len(seeds)} seeds'}, medians)\n")
        print("| config | τ | τ × chain | decode tok/s | × plain | GB/s | verified/round | branch wins | "
              "alternatives won / promised |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, values in results.items():
            m = {k: statistics.median(v) for k, v in values.items()}
            chain = results.get(f"{name.split()[0]} chain")
            tau_ratio = "" if spec_is_plain(name) or chain is None else \
                f"{statistics.median(a / b for a, b in zip(values['tau'], chain['tau']) if b):.2f}"
            promised = sum(values["alt_promised"])  # all runs together: each run has few
            calibration = f"{sum(values['alt_wins'])}/{promised:.1f}" if promised else ""
            print(f"| {name} | {m['tau']:.2f} | {tau_ratio} | {m['speed']:.1f} | {m['ratio']:.2f} | {m['gbs']:.1f} | "
                  f"{m['nodes']:.1f} | {m['wins']:.0%} | {calibration} |", flush=True)


def served(target: specdec.api.LoadedModel, row, params: specdec.SamplingParams) -> list[int]:  # noqa: ANN001 - PromptRow
    """A request the shared suffix table has seen: its prompt's tail and its plain output."""
    ids = specdec.api.encode_prompt(target, row.turns[0], chat=row.chat)
    return ids[-PROMPT_CONTEXT:] + specdec.generate(target, ids, params).token_ids


def flatten_costs(target: specdec.api.LoadedModel, draft: specdec.api.LoadedModel | None) -> None:
    """Plan drafts and trees with a GPU's flat cost curves instead of this CPU's (see ``--costs``)."""
    target.backend.step_seconds = None  # VerifyCosts.from_measured(None): every k costs the same
    specdec.adaptive.VerifyCosts.update = lambda self, k, seconds: None  # and stays so
    if draft is not None:  # a GPU forwards 4 draft rows for ~1.1 single-row steps: the widest trees
        draft.backend.step_seconds = {rows: 1.0 for rows in range(1, 9)}


def spec_is_plain(name: str) -> bool:
    return name == "plain"


if __name__ == "__main__":
    main()
