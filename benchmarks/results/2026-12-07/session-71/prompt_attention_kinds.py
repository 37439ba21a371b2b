"""One layer's prompt attention, float32 vs avx512-bf16, same process, interleaved (median of 6 after one), and
the split-invariance / float64-reference check of both kinds on four head shapes.
    .venv/bin/python prompt_attention_kinds.py"""
import statistics, time, torch, sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from specdec.kernels.build import kernel
from tests.test_prompt_attention import prompt, run_in_passes, reference
ops = kernel(); torch.set_num_threads(2)
for heads, kv, D in [(12, 2, 128), (14, 2, 64), (4, 4, 32), (10, 2, 40)]:
    qkv, cos, sin = prompt(heads, kv, D, 300, seed=1)
    res = {}
    for kind in ("float32", "avx512-bf16"):
        ops.set_prompt_attention_kind(kind)
        whole, k, v = run_in_passes(ops.prompt_attention, qkv, cos, sin, heads, kv, D, [300], 310)
        split, k2, v2 = run_in_passes(ops.prompt_attention, qkv, cos, sin, heads, kv, D, [37, 1, 100, 162], 310)
        ref = reference(qkv, cos, sin, heads, kv, D)
        err = (torch.linalg.norm(whole.double() - ref) / torch.linalg.norm(ref)).item()
        print(heads, kv, D, kind, "split-equal", torch.equal(whole, split), "relerr %.2e" % err)
for heads, kv, D in [(12, 2, 128), (14, 2, 64)]:
    for T in [512, 1024, 2432]:
        qkv = torch.randn(T, (heads + 2 * kv) * D); ang = torch.rand(T, D) * 6
        cos, sin = ang.cos().contiguous(), ang.sin().contiguous()
        kinds = ["float32", "avx512-bf16"]; times = {k: [] for k in kinds}
        for rep in range(7):
            for kind in kinds if rep % 2 else kinds[::-1]:
                ops.set_prompt_attention_kind(kind)
                kc, vc = torch.zeros(kv, T, D), torch.zeros(kv, T, D)
                t = time.perf_counter(); ops.prompt_attention(qkv, cos, sin, kc, vc, 0, heads, kv, None)
                times[kind].append(time.perf_counter() - t)
        print(f"{heads}/{kv}x{D} T={T}: " + ", ".join(f"{k} {statistics.median(v[1:])*1e3:.1f} ms" for k, v in times.items()), flush=True)
