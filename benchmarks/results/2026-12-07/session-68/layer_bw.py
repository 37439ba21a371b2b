import time, torch, statistics
from specdec.kernels.q4 import Q4Linear
from specdec.kernels.int8 import Int8Linear
torch.manual_seed(0)
shapes = {"qkv": (896, 1152), "o": (896, 896), "gate_up": (896, 9728), "down": (4864, 896), "head": (896, 65536),
          "tgt_gate_up": (1536, 17920), "tgt_down": (8960, 1536)}
def nbytes(m):
    return sum(b.numel() * b.element_size() for b in m.buffers())
def stack(make, K, N, copies):
    return [make(torch.randn(N, K) * 0.02) for _ in range(copies)]
res = {}
for name, (K, N) in shapes.items():
    for kind, make in (("q4", Q4Linear.from_float), ("i8", Int8Linear.from_float)):
        copies = max(1, int(200e6 / (K * N * (0.56 if kind == "q4" else 1))))  # > L3: stream from DRAM
        mods = stack(make, K, N, copies)
        x = torch.randn(1, K)
        b = nbytes(mods[0]) if kind == "q4" else K * N
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for m in mods: m(x)
            ts = []
            for rep in range(5):
                t0 = time.perf_counter()
                for m in mods: m(x)
                ts.append((time.perf_counter() - t0) / copies)
            t = statistics.median(ts)
            print(f"{name:12s} {kind} thr={threads} {t*1e3:7.3f} ms/layer {b/t/1e9:6.1f} GB/s ({copies} copies)", flush=True)
        del mods
# pure read
buf = torch.empty(300_000_000 // 8, dtype=torch.int64).random_()
for threads in (1, 2):
    torch.set_num_threads(threads)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter(); buf.sum(); ts.append(time.perf_counter() - t0)
    print(f"read-sum thr={threads} {300e6/statistics.median(ts)/1e9:.1f} GB/s")
