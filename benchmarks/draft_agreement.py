"""Where a draft model disagrees with its target (issue 23, DistillSpec): teacher-forced argmax
agreement over the *target's own* greedy continuations of held-out prompts — the text greedy
speculation drafts over — and, at each disagreement, how sure the target itself was.

    .venv/bin/python benchmarks/draft_agreement.py --draft qwen2.5-coder-0.5b --draft /tmp/distilled --prompts 24

Why: a distilled draft can only win back disagreements that are learnable. Where the target's own
top probability is below 0.5 its greedy token is a near-tie that a smaller model matches by luck;
where it is above 0.8 the draft is simply wrong. The table says how much of the gap is which.
Prompts: the held-out stdlib functions' prompts `train-drafter` speculates on (never trained on),
or `--prompts-from humaneval` (HumanEval's, held out by construction). Greedy agreement needs no
timing, so the numbers do not depend on the machine's load; the CPU goes in the header anyway.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402

#: bands of the target's own top probability at a position
CONFIDENCE_BANDS = ((0.0, 0.5), (0.5, 0.8), (0.8, 0.95), (0.95, 1.01))


def held_out_prompts(source: str, count: int, target) -> list[list[int]]:  # noqa: ANN001 - LoadedModel
    if source == "humaneval":
        from specdec.bench.datasets import load_prompts

        return [specdec.api.encode_prompt(target, row.turns[0], chat=row.chat) for row in load_prompts("humaneval", limit=count)]
    from specdec.train.data import load_documents
    from specdec.train.generated import held_out_prompts as stdlib_prompts

    return stdlib_prompts(load_documents("stdlib"), target.tokenizer.encode, count, 0)


@torch.no_grad()
def next_token_probs(model, ids: list[int], start: int) -> torch.Tensor:  # noqa: ANN001 - LoadedModel
    """``model``'s next-token distributions ``[len(ids) - start, vocab]`` after positions start-1 .. len-2."""
    decoder = model.backend.decoder
    logits = decoder(torch.tensor(ids), torch.arange(len(ids)), decoder.new_cache(len(ids) + 8))
    return logits[start - 1 : -1].float().softmax(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="the target")
    parser.add_argument("--quantize", default="int8", help="the target's execution mode (greedy tokens differ by mode)")
    parser.add_argument("--draft", action="append", default=[], metavar="NAME|DIR",
                        help="a draft model (repeatable; default: qwen2.5-coder-0.5b); run in float32")
    parser.add_argument("--prompts", type=int, default=24, help="held-out prompts (default: 24)")
    parser.add_argument("--prompts-from", choices=["stdlib", "humaneval"], default="stdlib")
    parser.add_argument("--max-tokens", type=int, default=96, help="target tokens per prompt (default: 96)")
    args = parser.parse_args()
    drafts = args.draft or ["qwen2.5-coder-0.5b"]

    target = specdec.load_model(args.model, quantize=args.quantize)
    prompts = held_out_prompts(args.prompts_from, args.prompts, target)
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    texts = [(ids, specdec.generate(target, ids, params).token_ids) for ids in prompts]
    # only each position's two likeliest under the target: whole [T, 151936] rows for 24 texts were ~1.4 GB
    target_top2 = [next_token_probs(target, ids + out, len(ids)).topk(2, -1) for ids, out in texts]
    print(f"# draft agreement with {args.model} ({args.quantize}) on its greedy continuations of {len(texts)} "
          f"held-out {args.prompts_from} prompts × {args.max_tokens} tokens\n\nCPU: {cpu_description()}\n")
    print("| draft | agreement | " + " | ".join(f"target p1 {lo:g}–{min(hi, 1):g}: disagree (share)" for lo, hi in CONFIDENCE_BANDS)
          + " | draft took target's 2nd |")
    print("|---|---|" + "---|" * len(CONFIDENCE_BANDS) + "---|")
    for name in drafts:
        draft = specdec.load_model(name, dtype="float32", quantize="none")
        top1, disagree, second = [], [], 0
        for (ids, out), top2 in zip(texts, target_top2):
            picked = next_token_probs(draft, ids + out, len(ids)).argmax(-1)
            wanted = torch.tensor(out)
            wrong = picked != wanted
            top1 += top2.values[:, 0].tolist()
            disagree += wrong.tolist()
            second += int((picked[wrong] == top2.indices[wrong, 1]).sum())
        wrong_total = max(1, sum(disagree))
        cells = []
        for lo, hi in CONFIDENCE_BANDS:
            band = [miss for p1, miss in zip(top1, disagree) if lo <= p1 < hi]
            cells.append(f"{sum(band) / max(1, len(band)):.3f} ({sum(band) / wrong_total:.2f})")
        print(f"| {name} | {1 - sum(disagree) / len(disagree):.4f} | " + " | ".join(cells)
              + f" | {second / wrong_total:.2f} |", flush=True)


if __name__ == "__main__":
    main()
