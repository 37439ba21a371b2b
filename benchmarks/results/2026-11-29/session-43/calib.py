"""Greedy trees: do the drafter's node estimates match what verification accepts? (session 43)
Usage: python calib.py GROUP METHOD TARGET_MODE [N]"""
import sys, statistics, torch, specdec
import specdec.engine as E
from specdec.drafters.suffix import clear_global_caches
from specdec.bench.datasets import load_prompts
torch.set_num_threads(2)
group, method, mode = sys.argv[1], sys.argv[2], sys.argv[3]
n = int(sys.argv[4]) if len(sys.argv) > 4 else 6
target = specdec.load_model("qwen2.5-coder-1.5b", quantize=mode, prompt_quantize=None if mode == "int8" else "auto")
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
rounds = []
orig_fit, orig_vt = E.fit_tree, E.verify_tree
cur = {}
def fit(draft_, *a, **k):
    kept = orig_fit(draft_, *a, **k)
    cur["est"] = [draft_.prefix_accept[i] for i in kept] if draft_.prefix_accept else None
    cur["parents"] = draft_.nodes(kept).parents
    return kept
def vt(tokens, parents, *a, **k):
    path, nxt = orig_vt(tokens, parents, *a, **k)
    rounds.append((cur.get("est"), list(parents), list(path)))
    return path, nxt
E.fit_tree, E.verify_tree = fit, vt
GROUPS = {"humaneval": ("humaneval", None), "mt_bench": ("spec_bench", ["mt_bench"])}
dataset, cats = GROUPS[group]
rows = load_prompts(dataset, cats, n)
params = specdec.SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
for row in rows:
    ids = specdec.api.encode_prompt(target, row.turns[0], chat=row.chat)
    clear_global_caches()
    spec = specdec.SpecConfig(method=method, num_speculative_tokens="auto", spec_tree="auto")
    s = specdec.generate(target, ids, params, draft=draft, spec=spec).stats
    print("prompt tau %.2f rounds %d" % (s.mean_accepted_len, s.target_forwards), flush=True)
# per round: first-choice path = nodes whose every ancestor is the first child of its parent
main_prom = main_won = side_prom = side_won = 0.0
nodes_total = side_nodes = 0
for est, parents, path in rounds:
    if est is None: continue
    first = {}
    for i, p in enumerate(parents):
        first.setdefault(p, i)
    on_main = []
    for i, p in enumerate(parents):
        on_main.append(first[p] == i and (p < 0 or on_main[p]))
    acc = set(path)
    for i, e in enumerate(est):
        nodes_total += 1
        if on_main[i]:
            main_prom += e; main_won += i in acc
        else:
            side_nodes += 1; side_prom += e; side_won += i in acc
print(f"rounds {len(rounds)} nodes/round {nodes_total/len(rounds):.2f} side nodes/round {side_nodes/len(rounds):.2f}")
print(f"first-choice path: promised {main_prom:.1f} won {main_won:.0f} ratio {main_won/max(main_prom,1e-9):.3f}")
print(f"siblings' subtrees: promised {side_prom:.1f} won {side_won:.0f} ratio {side_won/max(side_prom,1e-9):.3f}")
