"""One prompt pass's attention (a layer, T tokens) with each way prompt_attention can multiply on this CPU
(set_prompt_attention_kind: amx-bf16, avx512-bf16, float32), same process, interleaved, median of 8.
    .venv/bin/python prompt_attention_kinds.py"""
import statistics, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from specdec.cpu import cpu_description
from specdec.kernels.build import kernel

ops = kernel()
torch.set_num_threads(2)
kinds = []
for kind in ("amx-bf16", "avx512-bf16", "float32"):
    try:
        ops.set_prompt_attention_kind(kind)
        kinds.append(kind)
    except RuntimeError:
        pass
print(f"# {cpu_description()}; 2 threads")
for heads, kv, D in [(12, 2, 128), (14, 2, 64)]:
    for T in [512, 1024, 2432]:
        qkv = torch.randn(T, (heads + 2 * kv) * D); ang = torch.rand(T, D) * 6
        cos, sin = ang.cos().contiguous(), ang.sin().contiguous()
        times = {k: [] for k in kinds}
        for rep in range(9):
            for kind in kinds if rep % 2 else kinds[::-1]:
                ops.set_prompt_attention_kind(kind)
                kc, vc = torch.zeros(kv, T, D), torch.zeros(kv, T, D)
                t = time.perf_counter(); ops.prompt_attention(qkv, cos, sin, kc, vc, 0, heads, kv, None)
                times[kind].append(time.perf_counter() - t)
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        print(f"{heads}/{kv} heads of {D}, {T} tokens: " + ", ".join(f"{k} {m * 1e3:.1f} ms" for k, m in med.items()), flush=True)
ops.set_prompt_attention_kind(kinds[0])
