"""Prompt passes in another execution mode (``--prompt-quantize``): time to first token and end-to-end
tokens/s of plain decoding with the target's prompts in its own mode vs in the mode ``auto`` picks,
interleaved per prompt, on short (HumanEval) and long (Spec-Bench RAG/summarization) prompts.

    .venv/bin/python benchmarks/prompt_modes.py --quantize int4 --limit 6 --max-tokens 64

Prints per group the median TTFT and end-to-end tok/s of both, their ratio, and checks that each
configuration's greedy output is the same on every repeat. CPU flags go in the header.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import specdec  # noqa: E402
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402
from specdec.sampling import SamplingParams  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--quantize", default="int4", choices=("int8", "int4"))
    parser.add_argument("--prompt-quantize", default="auto", help="the mode compared with 'same' (default: auto)")
    parser.add_argument("--limit", type=int, default=6, help="prompts per group")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    same = specdec.load_model(args.model, quantize=args.quantize, prompt_quantize="same")
    other = specdec.load_model(args.model, quantize=args.quantize, prompt_quantize=args.prompt_quantize)
    prompt_mode = other.backend.prompt_backend.dtype_name
    groups = {"humaneval (short)": [r.turns[0] for r in load_prompts("humaneval", limit=args.limit)],
              "rag+summarization (long)": [r.turns[0] for r in load_prompts("spec_bench", ["rag", "summarization"], None)]}
    groups["rag+summarization (long)"] = groups["rag+summarization (long)"][: args.limit]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    print(f"# prompt passes: {args.quantize} target, prompts in {args.quantize} vs {prompt_mode}; {args.max_tokens} new tokens, "
          f"greedy, median of {args.repeats} repeats per prompt, interleaved; CPU {cpu_description()}")
    print("| group | prompt tokens (median) | TTFT same s | TTFT other s | TTFT ratio | e2e tok/s same | e2e tok/s other | e2e ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name, prompts in groups.items():
        rows = []
        for prompt in prompts:
            runs: dict[str, list] = {"same": [], "other": []}
            for _ in range(args.repeats):
                for label, model in (("same", same), ("other", other)):
                    runs[label].append(specdec.generate(model, prompt, params))
            for label in runs:
                assert len({tuple(r.token_ids) for r in runs[label]}) == 1, "greedy output changed between repeats"
            med = {label: (statistics.median(r.stats.ttft_s for r in rs),
                           statistics.median(len(r.token_ids) / r.stats.total_time_s for r in rs)) for label, rs in runs.items()}
            rows.append((runs["same"][0].stats.prompt_tokens, med["same"], med["other"]))
        tokens = statistics.median(r[0] for r in rows)
        ttft_s, ttft_o = statistics.median(r[1][0] for r in rows), statistics.median(r[2][0] for r in rows)
        e2e_s, e2e_o = statistics.median(r[1][1] for r in rows), statistics.median(r[2][1] for r in rows)
        ratio = statistics.median(r[2][1] / r[1][1] for r in rows)
        print(f"| {name} | {tokens:.0f} | {ttft_s:.2f} | {ttft_o:.2f} | {ttft_o / ttft_s:.2f} | {e2e_s:.1f} | {e2e_o:.1f} | {ratio:.2f}× |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
