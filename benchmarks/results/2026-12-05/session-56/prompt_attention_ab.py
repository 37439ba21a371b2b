"""One prompt pass's attention (a layer, T tokens, no cache before), this tree's prompt_attention against a
revision's (its attention where it had no prompt_attention: what prompt passes ran then), same process,
interleaved, median of 8. CPU: see the README.  .venv/bin/python prompt_attention_ab.py c1e8326"""
import torch, time, sys, statistics
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/benchmarks")
from specdec.kernels.build import kernel
from kernel_ab import base_kernels
new = kernel(); old = base_kernels(sys.argv[1] if len(sys.argv) > 1 else "HEAD")
torch.set_num_threads(2)
for heads, kv, D in [(12, 2, 128), (14, 2, 64)]:
    for T in [512, 1024, 2432]:
        qkv = torch.randn(T, (heads + 2 * kv) * D); ang = torch.rand(T, D) * 6
        cos, sin = ang.cos().contiguous(), ang.sin().contiguous()
        times = {"old": [], "new": []}
        for rep in range(9):
            for name, mod in (("old", old), ("new", new)) if rep % 2 else (("new", new), ("old", old)):
                kc = torch.zeros(kv, T, D); vc = torch.zeros(kv, T, D)
                t = time.perf_counter(); getattr(mod, "prompt_attention", mod.attention)(qkv, cos, sin, kc, vc, 0, heads, kv, None); times[name].append(time.perf_counter() - t)
        o, n = statistics.median(times["old"][1:]), statistics.median(times["new"][1:])
        print(heads, kv, D, T, f"old {o*1e3:.1f} ms new {n*1e3:.1f} ms old/new {o/n:.2f}", flush=True)
