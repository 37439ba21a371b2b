"""One 4-bit or 6-bit linear layer, a git revision's kernels vs this tree's, same process, alternating
(the layer-level A/Bs of the session-45 README).

    .venv/bin/python benchmarks/results/2026-11-29/session-45/layer_ab.py q4 HEAD    # 1536 -> 8960
    .venv/bin/python benchmarks/results/2026-11-29/session-45/layer_ab.py q6 64f6fba
"""
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from benchmarks.kernel_ab import base_kernels  # noqa: E402
from specdec.kernels import build  # noqa: E402
from specdec.kernels.q4 import Q4Linear  # noqa: E402
from specdec.kernels.q6 import Q6K_BLOCK_BYTES, Q6Linear  # noqa: E402

kind, revision = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "HEAD"
torch.set_num_threads(2)
base = base_kernels(revision)
outputs, width = 8960, 1536


def make_layer():
    if kind == "q4":
        weight = torch.randn(outputs, width, generator=torch.Generator().manual_seed(0)) * 0.05
        return Q4Linear.from_float(weight, None)
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=(outputs, width // 256, Q6K_BLOCK_BYTES), dtype=np.uint8)
    raw[..., 208:210] = rng.uniform(1e-4, 1e-3, size=(outputs, width // 256, 1)).astype(np.float16).view(np.uint8)
    return Q6Linear.from_q6k(raw.reshape(outputs, -1))


with build.layers_built_with(base):
    layers = {"base": make_layer()}
layers["new"] = make_layer()
gen = torch.Generator().manual_seed(1)
for rows in (8, 4, 1):
    x = torch.randn(rows, width, generator=gen)
    assert torch.equal(layers["base"](x), layers["new"](x))
    times = {"base": [], "new": []}
    for round_index in range(6):
        for name in ("base", "new") if round_index % 2 == 0 else ("new", "base"):
            for _ in range(3):
                layers[name](x)
            start = time.perf_counter()
            for _ in range(30):
                layers[name](x)
            times[name].append((time.perf_counter() - start) / 30 * 1e3)
    b, n = statistics.median(times["base"]), statistics.median(times["new"])
    print(f"{kind} rows {rows}: base {b:.2f} ms new {n:.2f} ms ratio {n / b:.3f} (same bits)")
