"""oneDNN's int8 GEMM (torch._int_mm) and bfloat16 matmul on one core, in GMAC/s, at the int8 prompt
twin's shapes: the vendor library's rate to read our int8_gemm's against (session 57, README.md here).

    .venv/bin/python benchmarks/results/2026-12-05/session-57/onednn-int8-rate.py
"""
import time, torch
torch.set_num_threads(1)
for (M, K, N) in [(256, 1536, 8960), (1024, 1536, 8960), (256, 8960, 1536)]:
    a = torch.randint(-100, 100, (M, K), dtype=torch.int8)
    b = torch.randint(-100, 100, (K, N), dtype=torch.int8)
    try:
        torch._int_mm(a, b)
        t = time.perf_counter(); n = 0
        while time.perf_counter() - t < 3: torch._int_mm(a, b); n += 1
        dt = (time.perf_counter() - t) / n
        print(f"_int_mm {M}x{K}x{N}: {dt*1e3:.2f} ms {M*K*N/dt/1e9:.0f} GMAC/s")
    except Exception as e: print("int_mm", e)
    x = torch.randn(M, K).bfloat16(); w = torch.randn(K, N).bfloat16()
    x @ w
    t = time.perf_counter(); n = 0
    while time.perf_counter() - t < 3: x @ w; n += 1
    dt = (time.perf_counter() - t) / n
    print(f"bf16 mm {M}x{K}x{N}: {dt*1e3:.2f} ms {M*K*N/dt/1e9:.0f} GMAC/s")
