"""Which int8 kernel makes verification cost flat on this CPU, and is it batch-invariant?

Table 1: the linear layers of a Qwen2.5-Coder-1.5B-shaped stack (28 layers × q,k,v,o,gate,up,down;
random weights), ms per forward of T tokens for each kernel candidate, achieved weight bandwidth
(GB/s at T=1), whether a row's output is bit-identical alone vs inside a chunk (``torch.equal``,
T=1..8), and the relative error against fp32 on LLM-like activations (a few outlier channels).
``--fused`` also runs the stack with q|k|v and gate|up concatenated (4 matmuls per layer, not 7).

Table 2 (when the GGUF is installed, or ``--model PATH``): the whole 1.5B model, fp32 vs our
quantized decoder, ms per forward of a T-token chunk appended to a 64-token context, T=1..9.

    .venv/bin/python benchmarks/int8_kernels.py                 # both tables
    .venv/bin/python benchmarks/int8_kernels.py --only int8-qdq7,fp32 --no-model
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HIDDEN, FFN, KV, LAYERS = 1536, 8960, 256, 28
SHAPES = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (FFN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN)]
FUSED_SHAPES = [(HIDDEN + 2 * KV, HIDDEN), (HIDDEN, HIDDEN), (2 * FFN, HIDDEN), (HIDDEN, FFN)]
#: the 0.5B draft (Qwen2.5-Coder-0.5B: hidden 896, FFN 4864, 2 KV heads of 64), fused as it runs
DRAFT_LAYERS, DRAFT_SHAPES = 24, [(896 + 2 * 128, 896), (896, 896), (2 * 4864, 896), (896, 4864)]
TOKENS = (1, 2, 4, 5, 8, 16)

Prep = Callable[[torch.Tensor], object]
Run = Callable[[object, torch.Tensor], torch.Tensor]


def _wq(weight: torch.Tensor, levels: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    scales = weight.abs().amax(1).clamp_min(1e-12) / levels
    return torch.clamp(torch.round(weight / scales[:, None]), -levels, levels).to(torch.int8), scales


def _packed(engine: str, weight: torch.Tensor, levels: int = 127) -> object:
    qweight, scales = _wq(weight, levels)
    torch.backends.quantized.engine = engine
    zeros = torch.zeros(qweight.shape[0], dtype=torch.long)
    return torch.ops.quantized.linear_prepack(torch._make_per_channel_quantized_tensor(qweight, scales.double(), zeros, 0), None)


def qdq(engine: str, act_levels: int, weight_levels: int) -> tuple[Prep, Run]:
    """fbgemm static-scale op, each row pre-divided by its own max |x| (per-token scales)."""
    zero_point = 64 if act_levels == 63 else 128

    def run(packed: object, x: torch.Tensor) -> torch.Tensor:
        r = x.abs().amax(-1, keepdim=True).clamp_min(1e-30)
        op = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32
        return op((x / r).contiguous(), 1.0 / act_levels, zero_point, packed) * r

    return (lambda w: _packed(engine, w, weight_levels)), run


def dynamic() -> tuple[Prep, Run]:
    """torch.ao dynamic quantization: ONE activation scale per chunk (reference, not invariant)."""
    return (lambda w: _packed("x86", w)), (lambda p, x: torch.ops.quantized.linear_dynamic(x, p, True))


def int_mm() -> tuple[Prep, Run]:
    """``torch._int_mm`` s8×s8→s32 (oneDNN), per-token activation scales, column-major weights."""

    def prep(weight: torch.Tensor) -> object:
        qweight, scales = _wq(weight)
        return qweight.t(), scales

    def run(p: object, x: torch.Tensor) -> torch.Tensor:
        wt, scales = p
        r = x.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 127
        return torch._int_mm(torch.round(x / r).to(torch.int8), wt).float() * r * scales

    return prep, run


def onednn_pointwise() -> tuple[Prep, Run]:
    """``onednn::qlinear_pointwise`` (the Inductor x86 int8 path), u8 activations, per-token scales."""

    def prep(weight: torch.Tensor) -> object:
        qweight, scales = _wq(weight)
        return torch.ops.onednn.qlinear_prepack(qweight, None), scales.float(), torch.zeros(qweight.shape[0], dtype=torch.long)

    def run(p: object, x: torch.Tensor) -> torch.Tensor:
        packed, scales, zeros = p
        r = x.abs().amax(-1, keepdim=True).clamp_min(1e-30)
        xq = (torch.round(x / r * 127) + 128).to(torch.uint8)
        out = torch.ops.onednn.qlinear_pointwise(xq, 1 / 127, 128, packed, scales, zeros, None, 1.0, 0, torch.float32, "none", [], "")
        return out * r

    return prep, run


def weight_only() -> tuple[Prep, Run]:
    """``aten._weight_int8pack_mm``: int8 weights, float activations and accumulation."""
    return (lambda w: _wq(w)), (lambda p, x: torch.ops.aten._weight_int8pack_mm(x, p[0], p[1]))


def int4_ours() -> tuple[Prep, Run]:
    """specdec.kernels.q4.Q4Linear (our C++ kernel: 4-bit weights in groups of 32, per-token int8
    activations, batch-invariant) — the int4 mode of targets and drafts."""
    from specdec.kernels.q4 import Q4Linear

    return (lambda w: Q4Linear.from_float(w)), (lambda m, x: m(x))


def floating(dtype: torch.dtype) -> tuple[Prep, Run]:
    return (lambda w: w.to(dtype)), (lambda p, x: F.linear(x.to(dtype), p).float())


def ours() -> tuple[Prep, Run]:
    """specdec.kernels.int8.Int8Linear as shipped."""
    from specdec.kernels.int8 import Int8Linear

    return (lambda w: Int8Linear.from_float(w)), (lambda m, x: m(x))


CANDIDATES: dict[str, Callable[[], tuple[Prep, Run]]] = {
    "specdec Int8Linear": ours,
    "int8-qdq a7w8 fbgemm": lambda: qdq("fbgemm", 63, 127),
    "int8-qdq a7w8 x86": lambda: qdq("x86", 63, 127),
    "int8-qdq a8w7 x86": lambda: qdq("x86", 127, 63),
    "int8 dynamic (1 scale/chunk)": dynamic,
    "torch._int_mm s8s8": int_mm,
    "onednn qlinear_pointwise": onednn_pointwise,
    "int8 weight-only": weight_only,
    "specdec Q4Linear (int4)": int4_ours,
    "fp32": lambda: floating(torch.float32),
    "bf16": lambda: floating(torch.bfloat16),
}


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def check_one_layer(prep: Prep, run: Run) -> tuple[bool, float]:
    """(bit-identical alone vs in chunks of 2..8, max relative row error vs fp32)."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(1024, HIDDEN, generator=gen) * 0.02
    x = torch.randn(8, HIDDEN, generator=gen)
    x[:, ::97] *= 8  # LLM activations have a few large channels
    p = prep(weight)
    invariant = all(torch.equal(run(p, x[:1])[0], run(p, x[:t])[0]) for t in range(2, 9))
    invariant = invariant and torch.equal(run(p, x[5:6])[0], run(p, x)[5])
    ref = F.linear(x, weight)
    return invariant, ((run(p, x) - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()


def stack_table(names: list[str], shapes: list[tuple[int, int]], repeats: int, num_layers: int = LAYERS) -> None:
    print(f"\nlinear stack, {num_layers} layers × {len(shapes)} matmuls, {torch.get_num_threads()} threads, median of {repeats} (ms per forward)")
    print(f"{'kernel':32s} " + " ".join(f"T={t:<5d}" for t in TOKENS) + "  GB/s@1  T5/T1  invariant  rel.err")
    for name in names:
        prep, run = CANDIDATES[name]()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                invariant, err = check_one_layer(prep, run)
                layers = [prep(torch.randn(o, i) * 0.02) for _ in range(num_layers) for (o, i) in shapes]
            except Exception as exc:  # an op this build lacks
                print(f"{name:32s} unavailable: {type(exc).__name__}: {str(exc)[:80]}")
                continue
            nbytes = sum(o * i for o, i in shapes) * num_layers * {"fp32": 4, "bf16": 2, "specdec Q4Linear (int4)": 0.5625}.get(name, 1)
            widths = [i for _, i in shapes]
            row = {}
            for t in TOKENS:
                xs = {w: torch.randn(t, w) for w in set(widths)}
                row[t] = median_ms(lambda: [run(p, xs[w]) for p, w in zip(layers, widths * num_layers)], repeats)
        del layers
        gc.collect()
        cells = " ".join(f"{row[t]:<7.1f}" for t in TOKENS)
        print(f"{name:32s} {cells} {nbytes / row[1] / 1e6:6.1f}  {row[5] / row[1]:5.2f}  {invariant!s:9s}  {err:.4f}", flush=True)


def model_table(path: Path, repeats: int) -> None:
    from specdec.kernels.convert import quantize_decoder
    from specdec.models.weights import load_decoder

    print(f"\nwhole model {path.name}: ms per forward of a T-token chunk after 64 context tokens (median of {repeats})")
    ids = torch.arange(64 + 9) * 37 % 5000
    results: dict[str, dict[int, float]] = {}
    for label in ("fp32", "int8"):
        decoder = load_decoder(path, torch.float32)
        if label == "int8":
            decoder = quantize_decoder(decoder)
        cache = decoder.new_cache(128)
        decoder(ids[:64], torch.arange(64), cache)
        results[label] = {}
        for t in range(1, 10):
            def step() -> None:
                cache.truncate(64)
                decoder(ids[64 : 64 + t], torch.arange(64, 64 + t), cache)

            results[label][t] = median_ms(step, repeats)
        del decoder, cache
        gc.collect()
    print("T     " + " ".join(f"{t:<7d}" for t in range(1, 10)))
    for label, row in results.items():
        print(f"{label:5s} " + " ".join(f"{row[t]:<7.1f}" for t in range(1, 10)))
    print("int8 T/T1 " + " ".join(f"{results['int8'][t] / results['int8'][1]:<5.2f}" for t in range(1, 10)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated candidate names (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--fused", action="store_true", help="also run the stack with fused q|k|v and gate|up")
    parser.add_argument("--model", type=Path, help="GGUF for table 2 (default: the installed qwen2.5-coder-1.5b)")
    parser.add_argument("--no-model", action="store_true", help="skip table 2")
    parser.add_argument("--draft", action="store_true", help="also run the 0.5B draft's fused linear stack")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = [n for n in CANDIDATES if args.only is None or any(s.strip() in n for s in args.only.split(","))]
    stack_table(names, SHAPES, args.repeats)
    if args.fused:
        print("\nfused q|k|v and gate|up:", end="")
        stack_table(names, FUSED_SHAPES, args.repeats)
    if args.draft:
        print("\n0.5B draft, fused q|k|v and gate|up:", end="")
        stack_table(names, DRAFT_SHAPES, args.repeats, DRAFT_LAYERS)
    if not args.no_model:
        path = args.model
        if path is None:
            from specdec.models.registry import is_installed, model_file

            path = model_file("qwen2.5-coder-1.5b") if is_installed("qwen2.5-coder-1.5b") else None
        if path is None:
            print("\n(no 1.5B GGUF installed: skipping the whole-model table)")
        else:
            model_table(path, args.repeats)


if __name__ == "__main__":
    main()
