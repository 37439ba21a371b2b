"""Does the draft model's prompt pass pay on long prompts? draft_suffix / draft_model with the draft
reading the whole prompt vs only its last N tokens (``SpecConfig.draft_context_window``), against
plain decoding of the same target, interleaved per prompt, greedy (every output checked identical).

    .venv/bin/python benchmarks/draft_window.py --categories summarization,rag --limit 6 --windows 0,512,1024

Prints per (method, window): median decode tok/s, TTFT, end-to-end tok/s, α, and the ratios to plain.
The CPU flags go in the header so results from different machines are not mixed up.
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
from specdec.drafters.suffix import clear_global_caches  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--quantize", default="int4", help="target execution mode")
    parser.add_argument("--draft-quantize", default="int4-all")
    parser.add_argument("--dataset", default="spec_bench")
    parser.add_argument("--categories", default="summarization,rag")
    parser.add_argument("--limit", type=int, default=6, help="prompts per category")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--methods", default="draft_suffix", help="comma-separated speculative methods")
    parser.add_argument("--windows", default="0,512", help="draft context windows to compare (0 = whole prompt)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    target = specdec.load_model(args.model, quantize=args.quantize)
    draft = specdec.load_model(args.draft_model, quantize=args.draft_quantize)
    rows = load_prompts(args.dataset, args.categories.split(","), args.limit)
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    configs: dict[str, specdec.SpecConfig | None] = {"plain": None}
    for method in args.methods.split(","):
        for window in (int(w) for w in args.windows.split(",")):
            configs[f"{method} window={window or 'all'}"] = specdec.SpecConfig(
                method=method, num_speculative_tokens="auto", draft_vocab_size=32768, draft_context_window=window)
    results: dict[str, dict[str, list[float]]] = {name: {} for name in configs}
    print(f"# {args.model} {args.quantize} + {args.draft_model} {args.draft_quantize}; CPU: {cpu_description()}; "
          f"{len(rows)} prompts ({args.categories}), {args.max_tokens} tokens, greedy", flush=True)
    for row in rows:
        ids = specdec.api.encode_prompt(target, row.turns[0], chat=row.chat)
        plain_tokens = None
        for name, spec in configs.items():
            clear_global_caches()
            out = specdec.generate(target, ids, params, draft=draft if spec else None, spec=spec)
            if spec is None:
                plain_tokens = out.token_ids
            elif out.token_ids != plain_tokens:
                print(f"MISMATCH {name} on {row.id}", flush=True)
            s = out.stats
            for key, value in (("decode", s.generated_tokens / s.decode_time_s), ("ttft", s.ttft_s),
                               ("e2e", s.generated_tokens / s.total_time_s), ("alpha", s.acceptance_rate)):
                results[name].setdefault(key, []).append(value)
        print(f"  {row.id}: {len(ids)} prompt tokens done", flush=True)
    base = {k: statistics.median(v) for k, v in results["plain"].items()}
    print("| config | decode tok/s | × plain decode | TTFT s | end-to-end tok/s | × plain e2e | α |")
    print("|---|---|---|---|---|---|---|")
    for name, values in results.items():
        m = {k: statistics.median(v) for k, v in values.items()}
        print(f"| {name} | {m['decode']:.1f} | {m['decode'] / base['decode']:.2f} | {m['ttft']:.2f} | {m['e2e']:.1f} | "
              f"{m['e2e'] / base['e2e']:.2f} | {m['alpha']:.2f} |")


if __name__ == "__main__":
    main()
