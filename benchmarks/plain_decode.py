"""Plain (non-speculative) decoding: specdec's own decoder vs transformers ``generate()``.

Same GGUF weights, same dtype, same threads, same HumanEval prompts, greedy; the two engines are
interleaved prompt by prompt and each figure is the median of ``--repeats``. Also prints achieved
memory bandwidth (weight bytes per token × tokens/s) against the machine's measured bandwidth.

    .venv/bin/python benchmarks/plain_decode.py --model qwen2.5-coder-1.5b --prompts 10 --max-tokens 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.bench.hardware import measure_memory_bandwidth_gb_s  # noqa: E402
from specdec.models.registry import resolve_model  # noqa: E402


def load_transformers(path: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype).eval()


def hf_decode_tokens_per_s(model, prompt_ids: list[int], max_tokens: int) -> tuple[float, list[int]]:
    """Decode tokens/s of transformers: (time of max_tokens) − (time of 1 token) excludes prefill."""
    ids = torch.tensor([prompt_ids])
    kwargs = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kwargs)
        first = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, **kwargs)
        total = time.perf_counter() - start
    return (max_tokens - 1) / max(total - first, 1e-9), out[0, len(prompt_ids):].tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-hf", action="store_true", help="skip transformers (ours only)")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    dtype = getattr(torch, args.dtype)

    bandwidth = measure_memory_bandwidth_gb_s()
    ours = specdec.load_model(args.model, dtype=args.dtype, device="cpu", progress=True)
    hf = None if args.no_hf else load_transformers(resolve_model(args.model), dtype)
    weight_gb = ours.backend.weight_bytes / 1e9
    rows = load_prompts("humaneval", limit=args.prompts)
    params = specdec.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    print(f"# plain decoding, {args.model}, {args.dtype}, {torch.get_num_threads()} threads, "
          f"{len(rows)} HumanEval prompts × {args.max_tokens} tokens, median of {args.repeats}")
    print(f"# weights read per token: {weight_gb:.2f} GB; measured memory bandwidth {bandwidth:.1f} GB/s "
          f"→ ceiling {bandwidth / weight_gb:.2f} tok/s")
    print("| prompt | ours tok/s | transformers tok/s | ratio | ours GB/s | % of bandwidth | same tokens |")
    print("|---|---|---|---|---|---|---|")
    ours_all, hf_all = [], []
    for row in rows:
        ids = ours.tokenizer.encode(row.turns[0])
        ours_runs, hf_runs, same = [], [], None
        for _ in range(args.repeats):
            result = specdec.generate(ours, ids, params)
            ours_runs.append(result.stats.tokens_per_s)
            if hf is not None:
                tps, hf_tokens = hf_decode_tokens_per_s(hf, ids, args.max_tokens)
                hf_runs.append(tps)
                same = hf_tokens == result.token_ids
        o = statistics.median(ours_runs)
        h = statistics.median(hf_runs) if hf_runs else float("nan")
        ours_all.append(o)
        hf_all.append(h)
        print(f"| {row.id} | {o:.2f} | {h:.2f} | {o / h:.2f} | {o * weight_gb:.1f} | {100 * o * weight_gb / bandwidth:.0f}% | {same} |", flush=True)
    o, h = statistics.median(ours_all), statistics.median(hf_all)
    print(f"| **median** | **{o:.2f}** | **{h:.2f}** | **{o / h:.2f}** | {o * weight_gb:.1f} | {100 * o * weight_gb / bandwidth:.0f}% | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
