"""Predicted outputs (OpenAI's ``prediction``): how much faster a request runs when the client sends
the text it expects, against the same request without it and against plain decoding — greedy,
configurations interleaved per prompt, every output checked identical to plain decoding.

    .venv/bin/python benchmarks/predicted_outputs.py --limit 6 --max-tokens 128

Two workloads, each a realistic reason to have a prediction:

* ``edit`` (HumanEval; ends at the model's end of turn, at most ``--max-tokens``): a chat request asks the model to rename a function in the code it is given
  (the HumanEval prompt with its canonical solution); the prediction is that code with the name
  replaced — what an editor sends. The code is in the prompt too, so this measures what the
  prediction adds to a drafter that already copies from the prompt (``draft_suffix``).
* ``revise`` (HumanEval and MT-Bench): the prediction is an earlier answer to the same prompt
  (sampled at temperature 0.8, another seed) — a client regenerating or revising an answer.

Prints per workload the medians over prompts of decode tok/s, its ratio to plain (per prompt, then
the median), τ, and the prediction's accepted/rejected tokens. The CPU flags and execution modes go
in the header.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
import specdec.api  # noqa: E402
import specdec.config  # noqa: E402
from specdec.bench.datasets import default_data_dir, load_prompts  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402
from specdec.drafters.suffix import clear_global_caches  # noqa: E402

EDIT_REQUEST = ("Rename the function `{old}` to `solution` in this Python code. Reply with the whole code and "
                "nothing else.\n\n```python\n{code}```")


def _spec(method: str) -> specdec.SpecConfig:
    return specdec.SpecConfig(method=method, num_speculative_tokens="auto")


#: name -> (speculative configuration or None for plain, whether the request carries the prediction)
CONFIGS = {"plain": (None, False), "draft_suffix": (_spec("draft_suffix"), False),
           "draft_suffix + prediction": (_spec("draft_suffix"), True),
           "suffix + prediction (no draft model)": (_spec("suffix"), True),
           "draft_model": (_spec("draft_model"), False), "draft_model + prediction": (_spec("draft_model"), True)}
DEFAULT_CONFIGS = ("plain", "draft_suffix", "draft_suffix + prediction", "suffix + prediction (no draft model)")


def edit_cases(limit: int) -> list[tuple[str, str, str]]:
    """(id, chat message, predicted code) for the first ``limit`` HumanEval tasks."""
    cases = []
    with open(default_data_dir() / "humaneval" / "humaneval_0_99.jsonl") as lines:
        for line in lines:
            task = json.loads(line)
            code = task["prompt"] + task["canonical_solution"]
            old = task["entry_point"]
            cases.append((task["task_id"], EDIT_REQUEST.format(old=old, code=code),
                          "```python\n" + code.replace(old, "solution") + "```"))
            if len(cases) == limit:
                break
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--quantize", default="int8", help="target execution mode (default: int8)")
    parser.add_argument("--draft-quantize", default="int4-all")
    parser.add_argument("--limit", type=int, default=6, help="prompts per workload (default: 6)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--workloads", default="edit,revise-humaneval,revise-mt_bench")
    parser.add_argument("--max-predicted", type=int, default=specdec.config.AUTO_MAX_PREDICTED_TOKENS,
                        help="γ=auto's longest round from a prediction (default: the library's)")
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                        help=f"comma-separated configurations, plain first (default: {','.join(DEFAULT_CONFIGS)}; "
                             f"available: {','.join(CONFIGS)})")
    args = parser.parse_args()
    specdec.config.AUTO_MAX_PREDICTED_TOKENS = args.max_predicted

    target = specdec.load_model(args.model, quantize=args.quantize)
    draft = specdec.load_model(args.draft_model, quantize=args.draft_quantize)
    print(f"# {args.model} {target.backend.mode} + {args.draft_model} {draft.backend.mode}; CPU: {cpu_description()}; "
          f"greedy, {args.max_tokens} tokens (EOS ignored but in edits), γ=auto (≤ {args.max_predicted} tokens a round from a prediction), "
          f"{args.limit} prompts a workload", flush=True)
    configs = {name: CONFIGS[name] for name in args.configs.split(",")}
    if next(iter(configs)) != "plain":
        parser.error("--configs: plain comes first (every ratio is to it, every output checked against it)")
    for workload in args.workloads.split(","):
        cases = cases_for(workload, args.limit, target, args.max_tokens)
        results: dict[str, list[dict]] = {name: [] for name in configs}
        for case_id, prompt, chat, prediction in cases:
            plain_ids = None
            for name, (config, predicted) in configs.items():
                clear_global_caches()  # each run drafts from its own prompt and prediction only
                # an edit ends where the code does (EOS honoured); revisions run max_tokens (EOS ignored)
                params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=workload != "edit",
                                                prediction=prediction if predicted else None)
                result = specdec.generate(target, prompt, params, draft=draft if config else None, spec=config, chat=chat)
                plain_ids = result.token_ids if plain_ids is None else plain_ids
                stats = result.stats
                results[name].append({"speed": stats.tokens_per_s, "tau": stats.mean_accepted_len,
                                      "e2e": stats.generated_tokens / stats.total_time_s,
                                      "identical": result.token_ids == plain_ids, "counts": stats.prediction_counts,
                                      "gbs": stats.achieved_gb_per_s})
            print(f"  {workload} {case_id}: " + ", ".join(f"{name} {r[-1]['speed']:.1f}" for name, r in results.items()),
                  file=sys.stderr, flush=True)
        report(workload, results)


def cases_for(workload: str, limit: int, target: specdec.api.LoadedModel, max_tokens: int) -> list[tuple[str, str, bool, str]]:
    """(id, prompt, chat, prediction) for each prompt of ``workload``."""
    if workload == "edit":
        return [(case_id, message, True, predicted) for case_id, message, predicted in edit_cases(limit)]
    group = workload.removeprefix("revise-")
    dataset, categories = ("humaneval", None) if group == "humaneval" else ("spec_bench", [group])
    cases = []
    for row in load_prompts(dataset, categories, limit):
        earlier = specdec.generate(target, row.turns[0], specdec.SamplingParams(temperature=0.8, seed=1, max_tokens=max_tokens),
                                   chat=row.chat)
        cases.append((row.id, row.turns[0], row.chat, earlier.text))
    return cases


def report(workload: str, results: dict[str, list[dict]]) -> None:
    plain = [r["speed"] for r in results["plain"]]
    print(f"\n## {workload}\n\n| config | decode tok/s | × plain | end-to-end × plain | τ | GB/s | "
          "prediction tokens accepted / rejected | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        ratio = statistics.median(r["speed"] / p for r, p in zip(rows, plain))
        counts = [r["counts"] for r in rows if r["counts"] is not None]
        kept = f"{sum(c[0] for c in counts)} / {sum(c[1] for c in counts)}" if counts else "–"
        e2e = statistics.median(r["e2e"] / p["e2e"] for r, p in zip(rows, results["plain"]))
        print(f"| {name} | {statistics.median(r['speed'] for r in rows):.1f} | {ratio:.2f} | {e2e:.2f} | "
              f"{statistics.median(r['tau'] for r in rows):.2f} | {statistics.median(r['gbs'] for r in rows):.1f} | {kept} | "
              f"{sum(r['identical'] for r in rows)}/{len(rows)} |", flush=True)


if __name__ == "__main__":
    main()
