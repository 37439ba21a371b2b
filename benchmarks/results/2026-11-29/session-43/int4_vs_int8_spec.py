"""make run's configuration (draft_suffix γ=auto, int4-all 0.5B draft) on the int4 target vs the int8 target,
and plain decoding in each, interleaved per prompt; 6 HumanEval + 6 MT-Bench prompts, 64 tokens, greedy (session 43)."""
import statistics, torch, specdec
from specdec.drafters.suffix import clear_global_caches
from specdec.bench.datasets import load_prompts
torch.set_num_threads(2)
targets = {"int4": specdec.load_model("qwen2.5-coder-1.5b", quantize="int4", prompt_quantize="auto"),
           "int8": specdec.load_model("qwen2.5-coder-1.5b", quantize="int8")}
for mode, t in targets.items():
    print(mode, "prompts", t.backend.prompt_backend.mode, "probe", {k: round(v * 1e3, 1) for k, v in list(t.backend.step_seconds.items())[:5]},
          "ratios", {k: round(v, 2) for k, v in t.backend.step_ratios.items()})
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
params = specdec.SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
spec = specdec.SpecConfig(method="draft_suffix", num_speculative_tokens="auto")
groups = {"humaneval": load_prompts("humaneval", None, 6), "mt_bench": load_prompts("spec_bench", ["mt_bench"], 6)}
res = {}
for rep in range(2):
    for group, rows in groups.items():
        for row in rows:
            for mode, target in targets.items():
                ids = specdec.api.encode_prompt(target, row.turns[0], chat=row.chat)
                plain = specdec.generate(target, ids, params).stats
                clear_global_caches()
                s = specdec.generate(target, ids, params, draft=draft, spec=spec).stats
                res.setdefault((group, mode), []).append((plain.tokens_per_s, s.tokens_per_s, s.mean_accepted_len))
for group in groups:
    base = [p for p, _, _ in res[(group, "int4")]]
    for mode in targets:
        v = res[(group, mode)]
        print(f"{group:10s} {mode}: plain {statistics.median(p for p, _, _ in v):.1f} tok/s, speculative {statistics.median(s for _, s, _ in v):.1f} "
              f"(tau {statistics.median(t for _, _, t in v):.2f}); speculative / int4 plain per prompt: "
              f"median {statistics.median(s / b for (_, s, _), b in zip(v, base)):.2f}")
