"""The int8 mode's two kernels on the real model, in one process: our AVX-512 VNNI GEMM vs fbgemm.

Loads the model in int8 twice (``SPECDEC_INT8_KERNEL`` chosen per load), then times forwards of T new
tokens after a 64-token context — T=1, 4 (decode, verification) and prompt chunks — alternating the two
models, min of the repeats per model and T. Prints ms, tokens/s, achieved weight bandwidth and compute
(GOPS: 2 × multiply-adds of the int8 layers and the one-row LM head), and the ratio. CPU flags go in the header.

    .venv/bin/python benchmarks/int8_gemm_ab.py --model qwen2.5-coder-1.5b --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import specdec  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402
from specdec.kernels import int8 as int8_module  # noqa: E402


def load(model: str, kernel: str) -> specdec.LoadedModel:
    """The model in int8 with ``kernel`` (the choice is cached per process: cleared around the load)."""
    os.environ["SPECDEC_INT8_KERNEL"] = kernel
    int8_module.int8_kernel.cache_clear()
    try:
        loaded = specdec.load_model(model, quantize="int8")
    finally:
        os.environ.pop("SPECDEC_INT8_KERNEL")
        int8_module.int8_kernel.cache_clear()
    return loaded


def time_forward(model: specdec.LoadedModel, tokens: int, context: list[int]) -> float:
    """Seconds of one forward of ``tokens`` new tokens after ``context`` (logits for the last row)."""
    backend = model.backend
    state = backend.new_state(len(context) + tokens + 8)
    backend.forward(state, context, num_logits=1)
    new = [(17 * i + 11) % 1000 + 100 for i in range(tokens)]
    start = time.perf_counter()
    backend.forward(state, new, num_logits=1)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--tokens", default="1,4,16,64,128,256", help="new tokens per forward, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(t) for t in args.tokens.split(",")]
    models = {"vnni": load(args.model, "vnni"), "fbgemm": load(args.model, "fbgemm")}
    decoder = models["vnni"].backend.decoder
    # the int8 weights a forward reads (the projections as loaded, before fusing, and the LM head,
    # which scores one row here); multiply-adds: T rows through the layers, one through the head
    weights = {name: m.in_features * m.out_features for name, m in decoder.named_modules()
               if isinstance(m, int8_module.Int8Linear)}
    layer_bytes = sum(weights.values())
    head_bytes = sum(size for name, size in weights.items() if name.endswith("lm_head"))
    context = [(31 * i + 7) % 1000 + 100 for i in range(64)]
    print(f"# {args.model} int8, int8 weights read per forward {layer_bytes / 1e9:.2f} GB; forwards of T new tokens after "
          f"{len(context)}, min of {args.repeats}, the two kernels alternating; torch threads "
          f"{torch.get_num_threads()}; CPU {cpu_description()}")
    print("| T | fbgemm ms | vnni ms | fbgemm → vnni | vnni tok/s | vnni GB/s | vnni GOPS |")
    print("|---|---|---|---|---|---|---|")
    for tokens in sizes:
        best = {name: float("inf") for name in models}
        for _ in range(args.repeats):
            for name, model in models.items():
                best[name] = min(best[name], time_forward(model, tokens, context))
        seconds = best["vnni"]
        print(f"| {tokens} | {best['fbgemm'] * 1e3:.1f} | {seconds * 1e3:.1f} | {best['fbgemm'] / seconds:.2f}× | "
              f"{tokens / seconds:.1f} | {layer_bytes / seconds / 1e9:.1f} | "
              f"{2 * ((layer_bytes - head_bytes) * tokens + head_bytes) / seconds / 1e9:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
