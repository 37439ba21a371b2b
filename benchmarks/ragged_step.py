"""What one forward over several requests costs against stepping them one by one (issue 24).

    .venv/bin/python benchmarks/ragged_step.py --quantize int8 --requests 1,2,4,8,16 --tokens 1,5

For N requests (each with its own 200-token context in its own KV cache) and T new tokens each
(1: a decode step; 5: a γ=4 draft to verify), times N separate ``Decoder.forward`` calls and one
``Decoder.forward_ragged`` call, interleaved, median of --repeats; prints ms, the ratio, the cost
in single-request steps, and the weight bandwidth achieved (the weights are read once per forward).
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
from specdec.cpu import cpu_description  # noqa: E402
from specdec.models.transformer import RaggedInput  # noqa: E402

CONTEXT = 200


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--quantize", default="int8", choices=("int8", "int4"))
    parser.add_argument("--requests", default="1,2,4,8,16")
    parser.add_argument("--tokens", default="1,5")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    model = specdec.load_model(args.model, quantize=args.quantize)
    decoder = model.backend.decoder
    weight_gb = decoder.weight_bytes / 1e9
    counts = [int(n) for n in args.requests.split(",")]
    gen = torch.Generator().manual_seed(0)
    caches = []
    for _ in range(max(counts)):
        cache = decoder.new_cache(CONTEXT + 16)
        decoder(torch.randint(0, 1000, (CONTEXT,), generator=gen), torch.arange(CONTEXT), cache, num_logits=1)
        caches.append(cache)
    print(f"# {args.model} {args.quantize}, {torch.get_num_threads()} threads, CPU {cpu_description()}, context {CONTEXT} per request, "
          f"median of {args.repeats}")
    print("| requests | tokens each | one by one ms | ragged ms | ragged / one by one | cost in 1-request steps | ragged GB/s |")
    print("|---|---|---|---|---|---|---|")
    single_step = None
    for tokens in [int(t) for t in args.tokens.split(",")]:
        for n in counts:
            new = [torch.randint(0, 1000, (tokens,), generator=gen) for _ in range(n)]
            positions = torch.arange(CONTEXT, CONTEXT + tokens)
            separate, ragged = [], []
            for _ in range(args.repeats + 1):  # the first round warms up
                start = time.perf_counter()
                for ids, cache in zip(new, caches):
                    decoder(ids, positions, cache)
                separate.append(time.perf_counter() - start)
                for cache in caches[:n]:
                    cache.truncate(CONTEXT)
                start = time.perf_counter()
                decoder.forward_ragged([RaggedInput(ids, positions, cache) for ids, cache in zip(new, caches)])
                ragged.append(time.perf_counter() - start)
                for cache in caches[:n]:
                    cache.truncate(CONTEXT)
            one, together = statistics.median(separate[1:]), statistics.median(ragged[1:])
            if n == 1 and tokens == 1:
                single_step = one
            steps = together / single_step if single_step else float("nan")
            print(f"| {n} | {tokens} | {one * 1e3:.1f} | {together * 1e3:.1f} | {together / one:.2f} | {steps:.2f} | "
                  f"{weight_gb / together:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
