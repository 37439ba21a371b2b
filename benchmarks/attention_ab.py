"""Did an attention change make verification of long prompts faster? This tree's C++ attention
(``layer_ops.cpp``) against a git revision's, one layer at a time, calls interleaved in one process.

Why a separate bench from kernel_ab.py: attention is a small share of a short-context step but
grows with context and with the rows verified together (9 rows over 1 536 cached tokens was 37 ms
of a 1.5B forward), and a whole-model A/B drowns it in the linears' noise. Each cell: median µs of
one layer's ``attention`` call (RoPE, cache write, grouped-query attention) for T rows after
``context`` cached slots, the base build and this build on each kernel path both have, alternating;
``new paths same bits`` must say yes (every path gives the same bits), ``new = base bits`` says yes
for a change that keeps every dot's order.

    .venv/bin/python benchmarks/attention_ab.py --base HEAD --heads 12 --kv-heads 2 --head-dim 128
    .venv/bin/python benchmarks/attention_ab.py --prompt --tokens 256 --contexts 0,1024,2048 --repeats 5

``--prompt`` times ``prompt_attention`` in its float32 kind instead — a prompt pass's attention where the CPU
has no AMX-BF16 tiles (AVX2 machines, Zen 4), which grows with the square of a long prompt.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kernel_ab import base_kernels  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402
from specdec.kernels.build import kernel  # noqa: E402


def time_call(fn, repeats: int) -> float:
    """Median µs of ``repeats`` calls after a warm-up."""
    for _ in range(5):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD", help="git revision whose kernels are the baseline (default HEAD)")
    parser.add_argument("--heads", type=int, default=12, help="query heads (default: the 1.5B's 12)")
    parser.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default 2)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dimension (default 128)")
    parser.add_argument("--tokens", default="1,4,9", help="rows per call, comma-separated (default 1,4,9)")
    parser.add_argument("--contexts", default="128,768,1536", help="cached slots before the rows (default 128,768,1536)")
    parser.add_argument("--repeats", type=int, default=60, help="timed calls per build and cell (default 60)")
    parser.add_argument("--rounds", type=int, default=3, help="base/new alternations per cell (default 3)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (default: all)")
    parser.add_argument("--prompt", action="store_true",
                        help="time prompt_attention (float32 kind: machines without AMX-BF16) instead of attention")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base, new = base_kernels(args.base), kernel()
    function = "prompt_attention" if args.prompt else "attention"
    if args.prompt:
        for module in (base, new):
            module.set_prompt_attention_kind("float32")
    heads, kv_heads, dim = args.heads, args.kv_heads, args.head_dim
    contexts = [int(c) for c in args.contexts.split(",")]
    capacity = max(contexts) + max(int(t) for t in args.tokens.split(",")) + 8
    print(f"# {cpu_description()}; {args.threads} threads; heads {heads}/{kv_heads}, head_dim {dim}; {function}")
    paths = [path for path in new.kernel_paths() if path in base.kernel_paths()]
    variants = [(f"{build_name} {path}", module, path) for path in paths
                for build_name, module in (("base", base), ("new", new))]
    print("| T | context | " + " | ".join(f"{path}: base µs | new µs | new ÷ base" for path in paths)
          + " | new paths same bits | new = base bits |")
    print("|---" * (4 + 3 * len(paths)) + "|")
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.randn(2, kv_heads, capacity, dim, generator=gen).unbind(0)
    k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    for rows in (int(t) for t in args.tokens.split(",")):
        qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=gen)
        cos, sin = torch.randn(2, rows, dim, generator=gen).unbind(0)
        cos, sin = cos.contiguous(), sin.contiguous()
        for context in contexts:
            def call(module, path, context=context, qkv=qkv, cos=cos, sin=sin):
                module.set_kernel_path(path)  # an atomic store: free beside the call
                return getattr(module, function)(qkv, cos, sin, k_cache, v_cache, context, heads, kv_heads, None)

            outputs = {name: call(module, path) for name, module, path in variants}
            new_outputs = [outputs[f"new {path}"] for path in paths]
            paths_agree = all(torch.equal(new_outputs[0], out) for out in new_outputs[1:])
            same_as_base = torch.equal(outputs[f"new {paths[0]}"], outputs[f"base {paths[0]}"])
            times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
            for round_index in range(args.rounds):
                for name, module, path in variants if round_index % 2 == 0 else variants[::-1]:
                    times[name].append(time_call(lambda m=module, p=path: call(m, p), args.repeats))
            cells = []
            for path in paths:
                b, n = statistics.median(times[f"base {path}"]), statistics.median(times[f"new {path}"])
                cells.append(f"{b:.0f} | {n:.0f} | {n / b:.3f}")
            print(f"| {rows} | {context} | " + " | ".join(cells)
                  + f" | {'yes' if paths_agree else 'NO'} | {'yes' if same_as_base else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
