"""The arithmetic a drafter trains in: bfloat16 mixed precision where this machine runs it faster,
float32 elsewhere — chosen by timing, not by CPU name.

A head's training is matmul-bound (the frozen LM head rows alone are ``[32768, hidden]``, run
forward and backward at every unrolled step). On a CPU with AVX-512 BF16 (or AMX) oneDNN runs
bfloat16 matmuls 2–3× faster than float32 (Zen 4: 390 vs 150 GFLOPS for the LM head's shape); on
an AVX2-only CPU it emulates them and loses. Mixed precision keeps float32 master weights,
optimizer state and losses; only the matmuls' inputs are rounded to bfloat16 (``torch.autocast``).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Iterator

import torch
import torch.nn.functional as F

from specdec.config import TRAIN_PRECISIONS
from specdec.errors import SpecdecError

#: bfloat16 must beat float32 by this much to be chosen: mixed precision rounds activations, so a
#: tie is not worth it
MIN_SPEEDUP = 1.25


def matmul_seconds(dtype: torch.dtype, rows: int = 256, hidden: int = 1536, out: int = 8192, repeats: int = 3) -> float:
    """Best-of-``repeats`` seconds of one ``[rows, hidden] × [hidden, out]`` matmul in ``dtype``
    (a head's training shapes, on the CPU)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, hidden, generator=generator).to(dtype)
    w = torch.randn(out, hidden, generator=generator).to(dtype)
    F.linear(x, w)  # warm-up: oneDNN picks and builds its kernel on first use
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        F.linear(x, w)
        best = min(best, time.perf_counter() - began)
    return best


def choose_precision(requested: str, device: torch.device | str = "cpu") -> str:
    """``requested`` (one of :data:`~specdec.config.TRAIN_PRECISIONS`) → what a training's matmuls
    run in on ``device``, ``float32`` or ``bfloat16`` (``TrainConfig.precision``). ``auto``: on a
    CPU, bfloat16 only if it times ≥ :data:`MIN_SPEEDUP`× faster than float32 here; on a GPU,
    bfloat16 where the card supports it (tensor cores: always the faster one)."""
    if requested not in TRAIN_PRECISIONS:
        raise SpecdecError(f"precision {requested!r} is not one of {', '.join(TRAIN_PRECISIONS)}")
    if requested != "auto":
        return requested
    if torch.device(device).type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    speedup = matmul_seconds(torch.float32) / matmul_seconds(torch.bfloat16)
    return "bfloat16" if speedup >= MIN_SPEEDUP else "float32"


@contextlib.contextmanager
def mixed_precision(precision: str, device_type: str = "cpu") -> Iterator[None]:
    """Autocast the matmuls on ``device_type`` (cpu, cuda) to ``precision`` (``float32``: nothing to
    do). The RMS norms then read bfloat16 activations with float32 weights, which torch computes
    unfused and says so at every call: expected here, so not shown."""
    if precision == "float32":
        yield
        return
    with warnings.catch_warnings(), torch.autocast(device_type, dtype=getattr(torch, precision)):
        warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
        yield
