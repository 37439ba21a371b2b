"""Per-row cost of the 4-bit, int8-weight and 6-bit linears on each kernel path, interleaved (session 43)."""
import time, statistics, torch, numpy as np
from specdec.kernels.build import kernel_paths, use_kernel_path
from specdec.kernels.q4 import Q4Linear, Q8Linear
torch.set_num_threads(2)
torch.manual_seed(0)
layers = {"q4 1536x8960": Q4Linear.from_float(torch.randn(8960, 1536) * 0.02),
          "q4 8960x1536": Q4Linear.from_float(torch.randn(1536, 8960) * 0.02),
          "q8 1536x8960": Q8Linear.from_float(torch.randn(8960, 1536) * 0.02)}
paths = kernel_paths()
for name, lin in layers.items():
    K = lin.in_features
    xs = {R: torch.randn(R, K) for R in (1, 2, 5, 8)}
    t = {(p, R): [] for p in paths for R in xs}
    for rep in range(40):
        for p in paths:
            with use_kernel_path(p):
                for R, x in xs.items():
                    s = time.perf_counter(); lin(x); t[(p, R)].append(time.perf_counter() - s)
    for p in paths:
        med = {R: min(t[(p, R)][3:]) * 1e3 for R in xs}
        per_row = (med[8] - med[2]) / 6
        print(f"{name:14s} {p:12s} " + " ".join(f"R{R} {v:.3f}" for R, v in med.items()) + f"  ms; per extra row {per_row:.3f} ms")
