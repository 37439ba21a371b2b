"""Physical limits to read speeds against: measured memory bandwidth."""

from __future__ import annotations

import time

import torch


def measure_memory_bandwidth_gb_s(size_mb: int = 512, repeats: int = 5) -> float:
    """Read bandwidth of a large float32 reduction (GB/s), median of ``repeats``.

    A decode step streams every weight once, so this bounds tokens/s at ``GB/s / weight GB``.
    """
    data = torch.ones(size_mb * 1024 * 1024 // 4, dtype=torch.float32)
    data.sum()  # warm-up / page in
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    times.sort()
    return data.numel() * 4 / times[len(times) // 2] / 1e9
