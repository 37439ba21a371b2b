"""Seeded sampling (specdec/seeded.py: shared clocks, drafts accepted when they are the target's own
choice) against rejection sampling (unseeded requests), on the real pair with the default configuration
(session 61). Per prompt, interleaved: plain decoding seeded, draft_suffix seeded, draft_suffix unseeded
(rejection sampling, a fresh random stream each run), 2 seeds.

Usage: python seeded_vs_rejection.py [GROUP ...] — humaneval, mt_bench (default both); t=0.7, 96 tokens,
6 prompts a group, γ=auto, int4 target (what --quantize auto picks on the AMX Xeon), int4-all draft.
Checks every seeded speculative output is identical to seeded plain decoding.
"""
import statistics, sys, torch, specdec
from specdec.bench.datasets import load_prompts
from specdec.cpu import cpu_description
from specdec.drafters.suffix import clear_global_caches
torch.set_num_threads(2)
groups = sys.argv[1:] or ["humaneval", "mt_bench"]
target = specdec.load_model("qwen2.5-coder-1.5b", quantize="int4", prompt_quantize="auto")
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
print("cpu", cpu_description())
SOURCES = {"humaneval": ("humaneval", None), "mt_bench": ("spec_bench", ["mt_bench"])}
spec = specdec.SpecConfig(method="draft_suffix", num_speculative_tokens="auto")
for group in groups:
    rows = load_prompts(*SOURCES[group], 6)
    res = {}
    for row in rows:
        ids = specdec.api.encode_prompt(target, row.turns[0], chat=row.chat)
        for seed in (1, 2):
            seeded = specdec.SamplingParams(temperature=0.7, max_tokens=96, seed=seed, ignore_eos=True)
            unseeded = specdec.SamplingParams(temperature=0.7, max_tokens=96, ignore_eos=True)
            clear_global_caches()
            plain = specdec.generate(target, ids, seeded)
            clear_global_caches()
            fast = specdec.generate(target, ids, seeded, draft=draft, spec=spec)
            assert fast.token_ids == plain.token_ids, (row.id, seed)
            clear_global_caches()
            rejection = specdec.generate(target, ids, unseeded, draft=draft, spec=spec)
            for name, out in (("plain", plain), ("seeded", fast), ("rejection", rejection)):
                s = out.stats
                res.setdefault(name, []).append(((s.generated_tokens - 1) / s.decode_time_s, s.acceptance_rate, s.mean_accepted_len))
    print(f"== {group} (6 prompts x 2 seeds, t=0.7, 96 tokens; seeded outputs identical to seeded plain)")
    for name, values in res.items():
        tok, alpha, tau = (statistics.median(c) for c in zip(*values))
        print(f"{name:10s} tok/s {tok:5.1f}  alpha {alpha:.3f}  tau {tau:.2f}")
    for name in ("seeded", "rejection"):
        ratios = [a[0] / b[0] for a, b in zip(res[name], res["plain"])]
        print(f"{name} / plain per pair: median {statistics.median(ratios):.3f}")
    ratios = [a[0] / b[0] for a, b in zip(res["seeded"], res["rejection"])]
    print(f"seeded / rejection per pair: median {statistics.median(ratios):.3f}", flush=True)
