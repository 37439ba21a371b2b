"""One layer's attention, this tree's kernels against HEAD's (benchmarks/kernel_ab.base_kernels): the same bits on
every path (causal and masked, several shapes), then ms per call for prompt passes of T tokens.
    .venv/bin/python attn_ab.py 512 1024 3072"""
import sys, time, statistics, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from benchmarks.kernel_ab import base_kernels
from specdec.kernels.build import kernel
base, new = base_kernels("HEAD"), kernel()
heads, kv, D = 12, 2, 128
gen = torch.Generator().manual_seed(0)
ok = True
# bits: several shapes, every path, causal and masked
for T, start in [(1, 0), (1, 700), (5, 300), (33, 0), (40, 17), (100, 0), (65, 64), (257, 3)]:
    S = start + T + 8
    kc, vc = (torch.randn(kv, S, D, generator=gen).contiguous() for _ in range(2))
    qkv = torch.randn(T, (heads + 2 * kv) * D, generator=gen)
    cos, sin = (torch.randn(T, D, generator=gen).contiguous() for _ in range(2))
    masks = [None, (torch.rand(T, start + T, generator=gen) < 0.5) | torch.nn.functional.pad(torch.eye(T, dtype=torch.bool), (start, 0))]
    for mask in masks:
        for path in new.kernel_paths():
            base.set_kernel_path(path); new.set_kernel_path(path)
            a = base.attention(qkv, cos, sin, kc.clone(), vc.clone(), start, heads, kv, mask)
            b = new.attention(qkv, cos, sin, kc.clone(), vc.clone(), start, heads, kv, mask)
            if not torch.equal(a, b):
                ok = False; print("DIFF", T, start, mask is not None, path, (a - b).abs().max().item())
print("bits equal:", ok, flush=True)
new.set_kernel_path(new.kernel_paths()[0]); base.set_kernel_path(new.kernel_paths()[0])
for T in [int(x) for x in sys.argv[1:]] or [512, 1024, 3072]:
    S = T + 8
    kc, vc = (torch.randn(kv, S, D, generator=gen).contiguous() for _ in range(2))
    qkv = torch.randn(T, (heads + 2 * kv) * D, generator=gen)
    cos, sin = (torch.randn(T, D, generator=gen).contiguous() for _ in range(2))
    res = {}
    for name, m in [("base", base), ("new", new), ("base", base), ("new", new)]:
        m.attention(qkv, cos, sin, kc, vc, 0, heads, kv, None)
        t = time.perf_counter(); m.attention(qkv, cos, sin, kc, vc, 0, heads, kv, None); res.setdefault(name, []).append(time.perf_counter() - t)
    b, n = min(res["base"]), min(res["new"])
    print(f"T={T}: base {b*1e3:.1f} ms, new {n*1e3:.1f} ms, new/base {n/b:.3f}", flush=True)
