import torch, time, sys
from specdec.kernels.build import kernel
from specdec.kernels.q4 import Q4Linear
m = kernel()
gen = torch.Generator().manual_seed(0)
shapes = {"down": (1536, 8960), "gate": (17920, 1536)}
layers = {k: Q4Linear.from_float(torch.randn(n, kk, generator=gen) * 0.05, None) for k, (n, kk) in shapes.items()}
for rows in [int(r) for r in sys.argv[1].split(",")]:
    for name, layer in layers.items():
        x = torch.randn(rows, layer.in_features if hasattr(layer, "in_features") else shapes[name][1], generator=gen)
        best = {0: 1e9, 1: 1e9}
        for rep in range(15):
            for mode in (0, 1):
                m.set_q4_amx_min_rows(mode)
                t = time.perf_counter()
                for _ in range(10): layer(x)
                best[mode] = min(best[mode], (time.perf_counter() - t) / 10)
        print(f"{name} rows {rows}: vnni {best[0]*1e3:.3f} amx {best[1]*1e3:.3f} ms  vnni/amx {best[0]/best[1]:.3f}")
