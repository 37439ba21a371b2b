"""Quality of the int8 execution mode vs the dequantized float32 model (same GGUF).

For each prompt (Spec-Bench, chat template): perplexity of both models on the prompt tokens, top-1
agreement of int8 vs float32 next-token predictions under teacher forcing on the float model's greedy
continuation, and the length of the identical prefix of both models' greedy continuations.

    .venv/bin/python benchmarks/int8_quality.py --prompts 12 --max-tokens 64
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
from specdec.api import encode_prompt  # noqa: E402
from specdec.bench.datasets import load_prompts  # noqa: E402


def logits_of(model: specdec.LoadedModel, ids: list[int]) -> torch.Tensor:
    state = model.backend.new_state(len(ids) + 1)
    return model.backend.forward(state, ids)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--prompts", type=int, default=12, help="prompts (spread over Spec-Bench task groups)")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    ref = specdec.load_model(args.model, "float32", "cpu", quantize="none")
    q = specdec.load_model(args.model, "float32", "cpu", quantize="int8")
    rows = load_prompts("spec_bench", limit=max(1, args.prompts // 6))[: args.prompts]
    params = specdec.SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    print(f"# int8 vs float32, {args.model}, {len(rows)} Spec-Bench prompts (first turn, chat template), {args.max_tokens} greedy tokens")
    print("| prompt | group | ppl float32 | ppl int8 | top-1 agreement (teacher-forced) | identical greedy prefix |")
    print("|---|---|---|---|---|---|")
    agreements, prefixes, ppl_ref, ppl_q = [], [], [], []
    for row in rows:
        ids = encode_prompt(ref, row.turns[0], chat=True)[:1024]
        cont = specdec.generate(ref, ids, params).token_ids
        cont_q = specdec.generate(q, ids, params).token_ids
        full = ids + cont
        lr, lq = logits_of(ref, full), logits_of(q, full)
        targets = torch.tensor(ids[1:])
        nll = lambda logits: torch.nn.functional.cross_entropy(logits[: len(ids) - 1], targets).item()  # noqa: E731
        pr, pq = math.exp(nll(lr)), math.exp(nll(lq))
        span = slice(len(ids) - 1, len(full) - 1)
        agree = (lr[span].argmax(-1) == lq[span].argmax(-1)).float().mean().item()
        prefix = next((i for i, (a, b) in enumerate(zip(cont, cont_q)) if a != b), len(cont))
        agreements.append(agree)
        prefixes.append(prefix)
        ppl_ref.append(pr)
        ppl_q.append(pq)
        print(f"| {row.id} | {row.category} | {pr:.2f} | {pq:.2f} | {agree:.1%} | {prefix}/{len(cont)} |", flush=True)
    print(f"| **median** | | {statistics.median(ppl_ref):.2f} | {statistics.median(ppl_q):.2f} | "
          f"{statistics.median(agreements):.1%} | {statistics.median(prefixes):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
