"""Do 2 MiB pages make a CPU model's forwards faster here? The same model loaded twice in one process — one
copy on ordinary 4 KiB pages (``SPECDEC_HUGE_PAGES=0`` while it loads), one moved onto transparent huge
pages as every CPU backend now is (specdec/huge_pages.py) — forwards alternating, which goes first
alternating too; each cell the median of ``--repeats`` forwards of T new tokens after ``--context`` cached
ones (the cache rolled back each time), as a decode or verification step sees it.

    .venv/bin/python benchmarks/huge_pages_ab.py --model qwen2.5-coder-1.5b --quantize int4 --tokens 1,2,4,5
    .venv/bin/python benchmarks/huge_pages_ab.py --model qwen2.5-coder-0.5b --quantize int4-all --tokens 1

Also prints each copy's resident huge pages (from /proc/self/smaps) and the time the move took, and
checks that both copies give the same logits (the move changes where the weights live, not a bit of them).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec  # noqa: E402
from specdec.backends.torch_backend import TorchBackend  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402
from specdec.huge_pages import huge_pages_supported, move_to_huge_pages  # noqa: E402


def anon_huge_bytes() -> int:
    """This process's anonymous memory on transparent huge pages (/proc/self/smaps_rollup)."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return 0


def load(model: str, quantize: str) -> TorchBackend:
    return specdec.load_model(model, "auto", "cpu", progress=False, quantize=quantize).backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="built-in name, GGUF file or HF directory")
    parser.add_argument("--quantize", default="int4", help="int4, int4-all, int8 or none (float32)")
    parser.add_argument("--tokens", default="1,2,4,5", help="forward sizes to time")
    parser.add_argument("--context", type=int, default=512, help="tokens already in the cache")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if not huge_pages_supported():
        raise SystemExit("huge pages are not available here (transparent_hugepage=never, not Linux, "
                         "or SPECDEC_HUGE_PAGES=0): nothing to compare")
    os.environ["SPECDEC_HUGE_PAGES"] = "0"
    small = load(args.model, args.quantize)
    os.environ["SPECDEC_HUGE_PAGES"] = "1"
    before = anon_huge_bytes()
    started = time.perf_counter()
    huge = load(args.model, args.quantize)
    load_seconds = time.perf_counter() - started
    moved = anon_huge_bytes() - before
    rng = random.Random(0)
    context = [rng.randrange(1000, 20000) for _ in range(args.context)]
    sizes = [int(t) for t in args.tokens.split(",")]
    states = {}
    for name, backend in (("4k", small), ("huge", huge)):
        state = backend.new_state(args.context + max(sizes) + 1)
        backend.forward(state, context, num_logits=1)
        states[name] = (backend, state)
    print(f"# {args.model} {args.quantize}, CPU: {cpu_description()}; {torch.get_num_threads()} threads, "
          f"context {args.context}, median of {args.repeats}; weights {huge.weight_bytes / 1e9:.2f} GB per step; "
          f"huge pages resident {moved / 1e9:.2f} GB, second load (with the move) {load_seconds:.1f} s")
    print("| T | 4 KiB pages ms | huge pages ms | huge ÷ 4 KiB | GB/s 4 KiB / huge |")
    print("|---|---|---|---|---|")
    for size in sizes:
        new = context[:size]
        times: dict[str, list[float]] = {"4k": [], "huge": []}
        outputs = {}
        for repeat in range(args.repeats + 1):
            order = ["4k", "huge"] if repeat % 2 == 0 else ["huge", "4k"]
            for name in order:
                backend, state = states[name]
                state.truncate(args.context)
                start = time.perf_counter()
                logits = backend.forward(state, new)
                if repeat:
                    times[name].append(time.perf_counter() - start)
                outputs[name] = logits
        if not torch.equal(outputs["4k"], outputs["huge"]):
            raise SystemExit(f"T={size}: the two copies' logits differ")
        small_ms, huge_ms = (statistics.median(times[n]) * 1e3 for n in ("4k", "huge"))
        gbs = [huge.weight_bytes / (ms / 1e3) / 1e9 for ms in (small_ms, huge_ms)]
        print(f"| {size} | {small_ms:.2f} | {huge_ms:.2f} | {huge_ms / small_ms:.3f} | {gbs[0]:.1f} / {gbs[1]:.1f} |")


if __name__ == "__main__":
    main()
