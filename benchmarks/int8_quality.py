"""Quality of the quantized execution modes (int8, int4) vs the dequantized float32 model (same GGUF).

For each prompt (Spec-Bench, chat template): perplexity of both models on the prompt tokens, top-1
agreement of int8 vs float32 next-token predictions under teacher forcing on the float model's greedy
continuation, and the length of the identical prefix of both models' greedy continuations.

    .venv/bin/python benchmarks/int8_quality.py --prompts 12 --max-tokens 64 --quantize int8,int4

int4 runs a Q4_K_M GGUF's Q4_K tensors with their own values (the float32 reference is those same
values dequantized), so its only departures are int8 activations (its Q6_K tensors run their own values too).
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
    parser.add_argument("--quantize", default="int8", help="modes to compare with float32, comma-separated")
    args = parser.parse_args()
    modes = args.quantize.split(",")
    ref = specdec.load_model(args.model, "float32", "cpu", quantize="none")
    quantized = {mode: specdec.load_model(args.model, "float32", "cpu", quantize=mode) for mode in modes}
    rows = load_prompts("spec_bench", limit=max(1, args.prompts // 6))[: args.prompts]
    params = specdec.SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    print(f"# {', '.join(modes)} vs float32, {args.model}, {len(rows)} Spec-Bench prompts (first turn, chat template), "
          f"{args.max_tokens} greedy tokens")
    print("| prompt | group | ppl float32 | " + " | ".join(
        f"ppl {m} | top-1 agreement {m} (teacher-forced) | identical greedy prefix {m}" for m in modes) + " |")
    print("|---|---|---|" + "---|---|---|" * len(modes))
    ppl_ref: list[float] = []
    columns: dict[str, list[list[float]]] = {m: [[], [], []] for m in modes}
    for row in rows:
        ids = encode_prompt(ref, row.turns[0], chat=True)[:1024]
        cont = specdec.generate(ref, ids, params).token_ids
        full = ids + cont
        lr = logits_of(ref, full)
        targets = torch.tensor(ids[1:])
        nll = lambda logits: torch.nn.functional.cross_entropy(logits[: len(ids) - 1], targets).item()  # noqa: E731
        span = slice(len(ids) - 1, len(full) - 1)
        ppl_ref.append(math.exp(nll(lr)))
        cells = []
        for mode, model in quantized.items():
            cont_q = specdec.generate(model, ids, params).token_ids
            lq = logits_of(model, full)
            pq = math.exp(nll(lq))
            agree = (lr[span].argmax(-1) == lq[span].argmax(-1)).float().mean().item()
            prefix = next((i for i, (a, b) in enumerate(zip(cont, cont_q)) if a != b), len(cont))
            for column, value in zip(columns[mode], (pq, agree, prefix)):
                column.append(value)
            cells.append(f"{pq:.2f} | {agree:.1%} | {prefix}/{len(cont)}")
        print(f"| {row.id} | {row.category} | {ppl_ref[-1]:.2f} | " + " | ".join(cells) + " |", flush=True)
    print(f"| **median** | | {statistics.median(ppl_ref):.2f} | " + " | ".join(
        f"{statistics.median(c[0]):.2f} | {statistics.median(c[1]):.1%} | {statistics.median(c[2]):.0f}"
        for c in columns.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
