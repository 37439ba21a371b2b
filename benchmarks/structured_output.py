"""Structured output under speculation: are JSON-schema outputs valid, identical to plain decoding,
and still faster? (issue 26's goal: 100 % valid on 50 prompts, speculation ≥ 1.2× plain on them)

Two tasks a user would constrain, on real prompts read from ``../shared/data``:

* ``gsm8k``: answer the question as ``{"reasoning": str ≤ 300 chars, "answer": number}``;
* ``humaneval``: describe the function as ``{"name", "arguments": [str], "returns", "summary"}``.

For every prompt, plain decoding (in the mode ``--quantize auto`` picks for plain decoding) and
speculative decoding (the modes it picks for the pair) run back to back, the order alternating per
prompt; greedy, so every speculative output is also checked token-identical to plain decoding in
the speculative target's own mode. Prints per group the validity, medians of end-to-end and decode
tokens/s and of the per-prompt ratios, α, and achieved GB/s; the CPU flags go in the header.

    .venv/bin/python benchmarks/structured_output.py --limit 25 --methods draft_model,draft_suffix
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import jsonschema
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
import specdec.api  # noqa: E402
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402
from specdec.drafters.suffix import clear_global_caches  # noqa: E402
from specdec.structured import StructuredOutput  # noqa: E402

TASKS = {
    "gsm8k": (
        "{text}\n\nReply with JSON only: a short 'reasoning' and the numeric 'answer'.",
        {"type": "object", "properties": {"reasoning": {"type": "string", "maxLength": 300}, "answer": {"type": "number"}},
         "required": ["reasoning", "answer"], "additionalProperties": False},
    ),
    "humaneval": (
        "Describe this Python function as JSON with its name, its argument names, what it returns and a "
        "one-sentence summary.\n\n{text}",
        {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 60},
            "arguments": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 6},
            "returns": {"type": "string", "maxLength": 120},
            "summary": {"type": "string", "maxLength": 240}},
         "required": ["name", "arguments", "returns", "summary"], "additionalProperties": False},
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--limit", type=int, default=25, help="prompts per task")
    parser.add_argument("--max-tokens", type=int, default=320)
    parser.add_argument("--methods", default="draft_model", help="comma-separated speculative methods")
    parser.add_argument("--out", type=Path, default=None, help="also write the per-prompt rows as JSONL here")
    args = parser.parse_args()
    torch.set_num_threads(2)
    plan = specdec.api.plan_execution(args.model, args.draft_model, method="draft_model")
    target = specdec.load_model(args.model, quantize=plan.target_mode)
    plain_target = target if plan.plain_mode == plan.target_mode else specdec.load_model(args.model, quantize=plan.plain_mode)
    draft = specdec.load_model(args.draft_model, quantize=plan.draft_mode)
    methods = args.methods.split(",")
    print(f"# {args.model}: plain {plan.plain_mode}, speculative {plan.target_mode} + {args.draft_model} "
          f"{plan.draft_mode}; CPU: {cpu_description()}; {args.limit} prompts per task, ≤ {args.max_tokens} tokens, "
          f"greedy, JSON schema", flush=True)
    rows_out = []
    for task, (template, schema) in TASKS.items():
        prompts = load_prompts(task, limit=args.limit)
        params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens,
                                        structured=StructuredOutput.from_schema(schema))
        for index, row in enumerate(prompts):
            text = row.meta["prompt"] if task == "humaneval" else row.turns[0]
            messages = [{"role": "user", "content": template.format(text=text)}]
            runs = [("plain", None), *((m, specdec.SpecConfig(method=m, num_speculative_tokens="auto")) for m in methods)]
            if index % 2:
                runs.reverse()  # alternate who runs first: the machine's speed drifts
            results = {}
            for name, spec in runs:
                clear_global_caches()
                model = plain_target if spec is None else target
                results[name] = specdec.generate(model, messages, params, draft=draft if spec else None, spec=spec)
            reference = results["plain"] if plain_target is target else specdec.generate(target, messages, params)
            for name, out in results.items():
                try:
                    jsonschema.validate(json.loads(out.text), schema)
                    valid = True
                except (ValueError, jsonschema.ValidationError):
                    valid = False
                rows_out.append(dict(task=task, prompt=row.id, method=name, valid=valid, finish=out.finish_reason,
                                     tokens=out.stats.generated_tokens, e2e_tok_s=out.stats.generated_tokens / out.stats.total_time_s,
                                     decode_tok_s=out.stats.tokens_per_s, gb_s=out.stats.achieved_gb_per_s,
                                     alpha=out.stats.acceptance_rate if name != "plain" else None,
                                     identical=None if name == "plain" else out.token_ids == reference.token_ids))
            print(f"  {task} {row.id}: " + ", ".join(
                f"{r['method']} {r['e2e_tok_s']:.1f} tok/s{' INVALID' if not r['valid'] else ''}"
                f"{' DIFFERS' if r['identical'] is False else ''}" for r in rows_out[-len(results):]), flush=True)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows_out))
    report(rows_out, methods)


def report(rows: list[dict], methods: list[str]) -> None:
    print(f"\n{'task':10} {'method':13} {'valid':>7} {'identical':>9} {'e2e tok/s':>9} {'decode':>7} {'GB/s':>5} "
          f"{'α':>5} {'e2e ×plain':>10} {'decode ×plain':>13}")
    for task in [*TASKS, "all"]:
        in_task = [r for r in rows if task in ("all", r["task"])]
        plain = {r["prompt"]: r for r in in_task if r["method"] == "plain"}
        for method in ["plain", *methods]:
            mine = [r for r in in_task if r["method"] == method]
            if not mine:
                continue
            ratio = lambda key: statistics.median(r[key] / plain[r["prompt"]][key] for r in mine)  # noqa: E731
            alphas = [r["alpha"] for r in mine if r["alpha"] is not None]
            identical = [r["identical"] for r in mine if r["identical"] is not None]
            print(f"{task:10} {method:13} {sum(r['valid'] for r in mine):>3}/{len(mine):<3} "
                  f"{(f'{sum(identical)}/{len(identical)}' if identical else '-'):>9} "
                  f"{statistics.median(r['e2e_tok_s'] for r in mine):9.1f} {statistics.median(r['decode_tok_s'] for r in mine):7.1f} "
                  f"{statistics.median(r['gb_s'] for r in mine):5.1f} {(statistics.median(alphas) if alphas else 0):5.2f} "
                  f"{ratio('e2e_tok_s'):10.2f} {ratio('decode_tok_s'):13.2f}")


if __name__ == "__main__":
    main()
