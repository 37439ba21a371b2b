"""The default greedy tree (`spec_tree="greedy"`) vs chains (`off`) on the target mode --quantize auto
picks, paired per prompt (session 61, issue 22's end-to-end condition).

Usage: python tree_gate_pairs.py GROUP [METHOD] [GAMMA] [TARGET_MODE] [TREES]
GROUP humaneval|mt_bench; METHOD draft_suffix (default) | draft_model; GAMMA auto (default) or an int;
TARGET_MODE int4 (default); TREES comma list, default off,greedy. Greedy, 96 tokens, 6 prompts x 2
repeats, int4-all 0.5B draft; each output checked identical to the chain's.
"""
import statistics, sys, torch, specdec
from specdec.config import verify_is_flat
from specdec.drafters.suffix import clear_global_caches
from specdec.bench.datasets import load_prompts
from specdec.cpu import cpu_description
torch.set_num_threads(2)
group = sys.argv[1] if len(sys.argv) > 1 else "humaneval"
method = sys.argv[2] if len(sys.argv) > 2 else "draft_suffix"
gamma = sys.argv[3] if len(sys.argv) > 3 else "auto"
gamma = gamma if gamma == "auto" else int(gamma)
target_mode = sys.argv[4] if len(sys.argv) > 4 else "int4"
trees = (sys.argv[5] if len(sys.argv) > 5 else "off,greedy").split(",")
target = specdec.load_model("qwen2.5-coder-1.5b", quantize=target_mode, prompt_quantize="auto")
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
curve = target.backend.step_seconds or {}
print("cpu", cpu_description())
print("target", target_mode, "curve ms", {k: round(v * 1e3, 1) for k, v in sorted(curve.items())}, "flat 1->4:", verify_is_flat(curve))
print("group", group, "method", method, "gamma", gamma, "trees", trees)
GROUPS = {"humaneval": ("humaneval", None), "mt_bench": ("spec_bench", ["mt_bench"])}
dataset, cats = GROUPS[group]
rows = load_prompts(dataset, cats, 6)
params = specdec.SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
res = {}
for rep in range(2):
    for row in rows:
        ids = specdec.api.encode_prompt(target, row.turns[0], chat=row.chat)
        outs = {}
        for tree in (trees if rep % 2 == 0 else trees[::-1]):
            spec = specdec.SpecConfig(method=method, num_speculative_tokens=gamma, spec_tree=tree)
            clear_global_caches()  # no run drafts from an earlier run of the same prompt
            result = specdec.generate(target, ids, params, draft=draft, spec=spec)
            s = result.stats
            outs[tree] = result.token_ids
            r = s.target_forwards
            nodes = s.tree_nodes / max(1, s.tree_rounds) if getattr(s, "tree_rounds", 0) else 0.0
            res.setdefault(tree, []).append((s.mean_accepted_len, (s.generated_tokens - 1) / s.decode_time_s,
                                             s.decode_time_s * 1e3 / r, nodes))
        assert all(o == outs[trees[0]] for o in outs.values()), "outputs differ"
for tree, v in res.items():
    cols = list(zip(*v))
    print(tree, "tau %.2f  tok/s %.1f  round ms %.1f  nodes/tree round %.1f" % tuple(statistics.median(c) for c in cols))
for tree in trees[1:]:
    pairs = [a[1] / b[1] for a, b in zip(res[tree], res[trees[0]])]
    taus = [a[0] / b[0] for a, b in zip(res[tree], res[trees[0]])]
    print(f"{tree}/{trees[0]} tok/s per pair: median %.3f" % statistics.median(pairs), " ".join("%.2f" % p for p in pairs))
    print(f"{tree}/{trees[0]} tau per pair: median %.3f" % statistics.median(taus))
