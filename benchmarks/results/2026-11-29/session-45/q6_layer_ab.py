import sys, time, statistics, torch, numpy as np
sys.path.insert(0, '.')
from benchmarks.kernel_ab import base_kernels
from specdec.kernels import build
from specdec.kernels.q6 import Q6K_BLOCK_BYTES, Q6Linear
torch.set_num_threads(2)
base = base_kernels(sys.argv[1] if len(sys.argv) > 1 else "HEAD")
rng = np.random.default_rng(0)
rows_w, blocks = 8960, 1536 // 256
raw = rng.integers(0, 256, size=(rows_w, blocks, Q6K_BLOCK_BYTES), dtype=np.uint8)
raw[..., 208:210] = rng.uniform(1e-4, 1e-3, size=(rows_w, blocks, 1)).astype(np.float16).view(np.uint8)
raw = raw.reshape(rows_w, blocks * Q6K_BLOCK_BYTES)
with build.layers_built_with(base):
    lb = Q6Linear.from_q6k(raw)
ln = Q6Linear.from_q6k(raw)
gen = torch.Generator().manual_seed(1)
for rows in (8, 4, 1):
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
