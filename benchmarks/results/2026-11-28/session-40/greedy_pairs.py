"""Chain vs tree=auto, interleaved per prompt, paired ratios (session 40).

Usage: python greedy_pairs.py GROUP [METHOD] [GAMMA] — GROUP humaneval|mt_bench, METHOD draft_model|draft_suffix,
GAMMA an int or auto, TARGET_MODE int8 (default) or int4 (session 42: make run's mode on the AMX Xeon, its
prompts read in the mode --prompt-quantize auto picks); greedy, 64 tokens, 6 prompts x 2 repeats, int4-all 0.5B draft.
Usage with the mode: python greedy_pairs.py GROUP METHOD GAMMA TARGET_MODE.
"""
import statistics, sys, torch, specdec
from specdec.drafters.suffix import clear_global_caches
from specdec.bench.datasets import load_prompts
torch.set_num_threads(2)
target_mode = sys.argv[4] if len(sys.argv) > 4 else "int8"
target = specdec.load_model("qwen2.5-coder-1.5b", quantize=target_mode,
                            prompt_quantize=None if target_mode == "int8" else "auto")
print("target", target_mode, "prompts", target.backend.prompt_backend.mode)
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
print("draft tree width", draft.backend.step_seconds and {k: round(v*1e3,1) for k, v in list(draft.backend.step_seconds.items())[:5]})
group = sys.argv[1] if len(sys.argv) > 1 else "humaneval"
method = sys.argv[2] if len(sys.argv) > 2 else "draft_model"
gamma = sys.argv[3] if len(sys.argv) > 3 else 4
gamma = gamma if gamma == "auto" else int(gamma)
print("group", group, "method", method, "gamma", gamma)
GROUPS = {"humaneval": ("humaneval", None), "mt_bench": ("spec_bench", ["mt_bench"])}
dataset, cats = GROUPS[group]
rows = load_prompts(dataset, cats, 6)
params = specdec.SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
res = {}
for rep in range(2):
    for row in rows:
        ids = specdec.api.encode_prompt(target, row.turns[0], chat=row.chat)
        for tree in ("off", "auto"):
            spec = specdec.SpecConfig(method=method, num_speculative_tokens=gamma, spec_tree=tree)
            clear_global_caches()  # no run drafts from an earlier run of the same prompt
            s = specdec.generate(target, ids, params, draft=draft, spec=spec).stats
            r = s.target_forwards
            res.setdefault(tree, []).append((s.draft_time_s / r * 1e3, s.verify_time_s / r * 1e3, s.mean_accepted_len,
                                             (s.generated_tokens - 1) / s.decode_time_s, s.decode_time_s * 1e3 / r))
for tree, v in res.items():
    cols = list(zip(*v))
    print(tree, "draft ms/round %.1f  verify ms/round %.1f  tau %.2f  tok/s %.1f  round ms %.1f" % tuple(statistics.median(c) for c in cols))
pairs = [a[3] / b[3] for a, b in zip(res["auto"], res["off"])]
print("tok/s auto/off per pair: median %.3f" % statistics.median(pairs), " ".join("%.2f" % p for p in pairs))
rt = [a[4] / b[4] for a, b in zip(res["auto"], res["off"])]
print("round time auto/off per pair: median %.3f" % statistics.median(rt))
