"""Prompt passes' attention in float32 vs with AVX-512 BF16's vdpbf16ps (attention_bf16.cpp), end to end: per
prompt, each kind runs plain decoding and the default speculation (draft_suffix γ=auto), kinds alternating
which goes first; prints per group the median time to first token and end-to-end tokens/s of each, the
ratios (bf16 ÷ float32, paired per prompt), and checks speculative output == plain output within each kind
(a MISMATCH line otherwise). Also counts prompts whose greedy text differs between the kinds (the bf16
products change the prompt cache's bits, as AMX's do). CPU flags in the header. Needs a CPU with AVX-512 BF16.

    .venv/bin/python benchmarks/long_context_prompts.py --out /tmp/long6.jsonl
    .venv/bin/python benchmarks/prompt_attention_ab.py --groups /tmp/long6.jsonl,summarization,rag,humaneval
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from interleaved import add_pair_args, group_prompts, header, load_pair  # (puts the project on sys.path)

import specdec  # noqa: E402
from specdec.drafters.suffix import clear_global_caches  # noqa: E402

KINDS = ("float32", "avx512-bf16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(parser)
    args = parser.parse_args()
    target, draft = load_pair(args)
    ops = target.backend.prompt_backend.decoder.layer_runner.ops
    chosen = ops.prompt_attention_kind()
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    spec = specdec.SpecConfig(method="draft_suffix")
    print(header(args, f"prompt attention float32 vs avx512-bf16 (this process chose {chosen})"), flush=True)
    print("| group | prompt tokens | TTFT f32 / bf16 (s) | bf16 ÷ f32 TTFT (plain runs) | plain e2e f32 / bf16 | spec e2e f32 / bf16 "
          "| spec bf16 ÷ plain f32 | greedy text differs |\n|---|---|---|---|---|---|---|---|")
    for group, prompt_ids in group_prompts(target, args):
        rows: list[dict[str, float]] = []
        differs = 0
        for number, ids in enumerate(prompt_ids):
            row: dict[str, float] = {}
            texts = {}
            for kind in KINDS if number % 2 == 0 else KINDS[::-1]:
                ops.set_prompt_attention_kind(kind)
                clear_global_caches()
                plain = specdec.generate(target, ids, params)
                clear_global_caches()
                fast = specdec.generate(target, ids, params, draft=draft, spec=spec)
                if fast.token_ids != plain.token_ids:
                    print(f"MISMATCH {kind} on {group} prompt {number}", flush=True)
                texts[kind] = plain.token_ids
                row[f"ttft {kind}"] = plain.stats.ttft_s  # (a speculative run's also holds the draft's prompt pass)
                row[f"plain {kind}"] = plain.stats.generated_tokens / plain.stats.total_time_s
                row[f"spec {kind}"] = fast.stats.generated_tokens / fast.stats.total_time_s
            differs += texts["float32"] != texts["avx512-bf16"]
            row["tokens"] = len(ids)
            rows.append(row)

        def med(key: str) -> float:
            return statistics.median(r[key] for r in rows)

        def ratio(a: str, b: str) -> float:
            return statistics.median(r[a] / r[b] for r in rows)

        print(f"| {Path(group).stem} ({len(rows)}) | {med('tokens'):.0f} | {med('ttft float32'):.2f} / "
              f"{med('ttft avx512-bf16'):.2f} | {ratio('ttft avx512-bf16', 'ttft float32'):.2f} | "
              f"{med('plain float32'):.1f} / {med('plain avx512-bf16'):.1f} | {med('spec float32'):.1f} / "
              f"{med('spec avx512-bf16'):.1f} | {ratio('spec avx512-bf16', 'plain float32'):.2f} "
              f"(f32 {ratio('spec float32', 'plain float32'):.2f}) | {differs} of {len(rows)} |", flush=True)
    ops.set_prompt_attention_kind(chosen)


if __name__ == "__main__":
    main()
