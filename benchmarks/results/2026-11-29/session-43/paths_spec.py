"""Does speculation pay on an AVX-VNNI-only CPU? make run's configuration (int4 target, int4-all draft,
draft_suffix, γ=auto) against plain int4 decoding, with the kernels forced to the AVX2 path and to the
AVX-VNNI path in turn (the AMX Xeon's core stands in for an Alder Lake-class one), interleaved per prompt,
6 HumanEval + 6 MT-Bench prompts x 2 repeats, 64 tokens, greedy (session 43)."""
import statistics, sys, torch, specdec
from specdec.drafters.suffix import clear_global_caches
from specdec.bench.datasets import load_prompts
from specdec.kernels.build import use_kernel_path
torch.set_num_threads(2)
target = specdec.load_model("qwen2.5-coder-1.5b", quantize="int4", prompt_quantize="auto")
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
params = specdec.SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
spec = specdec.SpecConfig(method="draft_suffix", num_speculative_tokens="auto")
groups = {"humaneval": load_prompts("humaneval", None, 6), "mt_bench": load_prompts("spec_bench", ["mt_bench"], 6)}
paths = sys.argv[1:] or ["avx2", "avx-vnni"]
res = {}
for rep in range(2):
    for group, rows in groups.items():
        for row in rows:
            ids = specdec.api.encode_prompt(target, row.turns[0], chat=row.chat)
            for path in paths:
                with use_kernel_path(path):
                    plain = specdec.generate(target, ids, params).stats
                    clear_global_caches()
                    out = specdec.generate(target, ids, params, draft=draft, spec=spec)
                    s = out.stats
                res.setdefault((group, path), []).append((s.tokens_per_s / plain.tokens_per_s, s.mean_accepted_len,
                                                          plain.tokens_per_s, s.tokens_per_s))
for (group, path), v in sorted(res.items()):
    ratio, tau, p, sp = (statistics.median(c) for c in zip(*v))
    print(f"{group:10s} {path:10s} speculative / plain decode tok/s: median {ratio:.2f} (tau {tau:.2f}; plain {p:.1f}, speculative {sp:.1f} tok/s)")
