import time, torch
from specdec.kernels.build import kernel
ops = kernel(); torch.set_num_threads(2)
def t(f, n=300):
    for _ in range(20): f()
    s = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - s) / n * 1e6
heads, kv, D, S = 12, 2, 128, 2048
kc = torch.randn(kv, S, D); vc = torch.randn(kv, S, D)
for T in (1, 9):
    qkv = torch.randn(T, (heads + 2 * kv) * D); cos = torch.randn(T, D); sin = torch.randn(T, D)
    for ctx in (128, 768, 1536):
        us = t(lambda: ops.attention(qkv, cos, sin, kc, vc, ctx, heads, kv, None))
        kv_bytes = 2 * kv * (ctx + T) * D * 4
        print(f"T={T} ctx={ctx}: {us:.0f} us per layer, x28 = {us*28/1e3:.1f} ms; KV read {kv_bytes/us/1e3:.1f} GB/s; "
              f"{T*heads*(ctx+T)*D*2/us/1e3:.1f} GMAC/s")
