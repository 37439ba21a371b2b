import sys, time, statistics, torch
sys.path.insert(0, '.')
from benchmarks.kernel_ab import base_kernels
from specdec.kernels import build
from specdec.kernels.q4 import Q4Linear
torch.set_num_threads(2)
base = base_kernels("HEAD")
gen = torch.Generator().manual_seed(0)
w = torch.randn(8960, 1536, generator=gen) * 0.05
with build.layers_built_with(base):
    lb = Q4Linear.from_float(w, None)
ln = Q4Linear.from_float(w, None)
for rows in (8, 4):
    x = torch.randn(rows, 1536, generator=gen)
    assert torch.equal(lb(x), ln(x))
    t = {"base": [], "new": []}
    for r in range(6):
        for name, l in (("base", lb), ("new", ln)) if r % 2 == 0 else (("new", ln), ("base", lb)):
            for _ in range(3): l(x)
            s = time.perf_counter()
            for _ in range(30): l(x)
            t[name].append((time.perf_counter() - s) / 30 * 1e3)
    b, n = statistics.median(t["base"]), statistics.median(t["new"])
    print(f"rows {rows}: base {b:.2f} ms new {n:.2f} ms ratio {n/b:.3f} (same bits)")
