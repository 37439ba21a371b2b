"""The int4 mode's 4-bit layers on AMX tiles against the AVX-512 VNNI path, in one process: one load, the
threshold switched between forwards (``use_q4_amx_rows``: the same output bits either way, checked here).

Times forwards of T new tokens after a context — T=1 (decode, never AMX), verification chunks and trees —
alternating AMX and VNNI, min of the repeats per T. Prints ms for each, VNNI ÷ AMX, and the AMX forward's
tokens/s and achieved weight bandwidth (the 4-bit and 6-bit weights as stored). CPU flags in the header.

    .venv/bin/python benchmarks/q4_amx_ab.py --tokens 2,4,5,9,16 --context 512 --repeats 7
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import specdec  # noqa: E402
from int8_gemm_ab import time_forward  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402
from specdec.kernels.build import kernel, use_q4_amx_rows  # noqa: E402


def logits_of(model: specdec.LoadedModel, tokens: int, context: list[int]) -> torch.Tensor:
    """The logits of every new row (for the bit comparison)."""
    backend = model.backend
    state = backend.new_state(len(context) + tokens + 8)
    backend.forward(state, context, num_logits=1)
    return backend.forward(state, [(17 * i + 11) % 1000 + 100 for i in range(tokens)], num_logits=tokens)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--tokens", default="1,2,4,5,9,16", help="new tokens per forward, comma-separated")
    parser.add_argument("--context", type=int, default=256, help="tokens already in the cache")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if not kernel().q4_amx_min_rows():
        parser.error("this CPU has no AMX-INT8 with AVX-512 VBMI (or the OS did not grant AMX, or another path is set)")
    model = specdec.load_model(args.model, quantize="int4")
    stored = sum(t.numel() * t.element_size() for name, t in model.backend.decoder.state_dict().items()
                 if "embed" not in name)
    context = [(31 * i + 7) % 1000 + 100 for i in range(args.context)]
    print(f"# {args.model} int4: forwards of T new tokens after {args.context}, min of {args.repeats}, AMX and VNNI "
          f"alternating in one process; weights as stored {stored / 1e9:.2f} GB; torch threads {torch.get_num_threads()}; "
          f"CPU {cpu_description()}")
    print("| T | VNNI ms | AMX ms | VNNI ÷ AMX | same bits | AMX tok/s | AMX GB/s |")
    print("|---|---|---|---|---|---|---|")
    for tokens in [int(t) for t in args.tokens.split(",")]:
        outputs = {}
        for on in (False, True):
            with use_q4_amx_rows(1 if on else 0):
                outputs[on] = logits_of(model, tokens, context)
        best = {False: float("inf"), True: float("inf")}
        for _ in range(args.repeats):
            for on in (False, True):
                with use_q4_amx_rows(1 if on else 0):
                    best[on] = min(best[on], time_forward(model, tokens, context))
        print(f"| {tokens} | {best[False] * 1e3:.1f} | {best[True] * 1e3:.1f} | {best[False] / best[True]:.3f} | "
              f"{'yes' if torch.equal(outputs[False], outputs[True]) else 'NO'} | {tokens / best[True]:.1f} | "
              f"{stored / best[True] / 1e9:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
