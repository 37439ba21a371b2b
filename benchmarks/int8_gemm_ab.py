"""The int8 mode's kernels on the real model, in one process: fbgemm, our AVX-512 VNNI GEMM, and
the same GEMM on Intel AMX tiles (``amx``: the VNNI load with AMX from one row on; same bits).

Loads the model in int8 once per packed format (``SPECDEC_INT8_KERNEL`` chosen per load), then times
forwards of T new tokens after a 64-token context — T=1, 4 (decode, verification) and prompt chunks —
alternating the kernels, min of the repeats per kernel and T. Prints ms per kernel, the ratio of the first
kernel's time to each other's, and for the last kernel tokens/s, achieved weight bandwidth and compute
(GOPS: 2 × multiply-adds of the int8 layers and the one-row LM head). CPU flags go in the header.

    .venv/bin/python benchmarks/int8_gemm_ab.py --model qwen2.5-coder-1.5b --repeats 5
    .venv/bin/python benchmarks/int8_gemm_ab.py --kernels vnni,amx --tokens 1,2,4,8,16,32,128,512
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
from specdec.kernels.build import kernel  # noqa: E402


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


def set_amx(on: bool) -> None:
    """AMX from one row on, or never, for the whole process (the VNNI kernel's panels serve both: same bits)."""
    kernel().set_int8_amx_min_rows(1 if on else 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--tokens", default="1,4,16,64,128,256", help="new tokens per forward, comma-separated")
    parser.add_argument("--kernels", default="fbgemm,vnni", help="comma-separated, first is the baseline: fbgemm, vnni, amx")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(t) for t in args.tokens.split(",")]
    names = args.kernels.split(",")
    if "amx" in names and not kernel().int8_amx_min_rows():
        parser.error("amx: this CPU has no AMX-INT8 (or the OS did not grant it)")
    loads = {fmt: load(args.model, fmt) for fmt in {"fbgemm" if n == "fbgemm" else "vnni" for n in names}}
    models = {name: loads["fbgemm" if name == "fbgemm" else "vnni"] for name in names}
    decoder = models[names[-1]].backend.decoder
    # the int8 weights a forward reads (the projections as loaded, before fusing, and the LM head,
    # which scores one row here); multiply-adds: T rows through the layers, one through the head
    weights = {name: m.in_features * m.out_features for name, m in decoder.named_modules()
               if isinstance(m, int8_module.Int8Linear)}
    layer_bytes = sum(weights.values())
    head_bytes = sum(size for name, size in weights.items() if name.endswith("lm_head"))
    context = [(31 * i + 7) % 1000 + 100 for i in range(64)]
    print(f"# {args.model} int8, int8 weights read per forward {layer_bytes / 1e9:.2f} GB; forwards of T new tokens after "
          f"{len(context)}, min of {args.repeats}, the kernels alternating; torch threads "
          f"{torch.get_num_threads()}; CPU {cpu_description()}")
    last = names[-1]
    print(f"| T | {' | '.join(f'{n} ms' for n in names)} | {' | '.join(f'{names[0]} → {n}' for n in names[1:])} | "
          f"{last} tok/s | {last} GB/s | {last} GOPS |")
    print("|---|" + "---|" * (2 * len(names) + 2))
    for tokens in sizes:
        best = {name: float("inf") for name in names}
        for _ in range(args.repeats):
            for name, model in models.items():
                set_amx(name == "amx")
                best[name] = min(best[name], time_forward(model, tokens, context))
        seconds = best[last]
        print(f"| {tokens} | {' | '.join(f'{best[n] * 1e3:.1f}' for n in names)} | "
              f"{' | '.join(f'{best[names[0]] / best[n]:.2f}×' for n in names[1:])} | {tokens / seconds:.1f} | "
              f"{layer_bytes / seconds / 1e9:.1f} | {2 * ((layer_bytes - head_bytes) * tokens + head_bytes) / seconds / 1e9:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
