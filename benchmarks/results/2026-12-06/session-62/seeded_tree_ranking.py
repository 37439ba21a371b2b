"""Seeded requests with trees on (spec_tree=auto): alternatives ranked by the draft's noisy scores q/E
(session 62) against q's likeliest (before), per prompt interleaved, plus the chain (spec_tree=off).

Usage: python seeded_tree_ranking.py [GROUP ...] — humaneval, mt_bench (default both); t=0.7, 96 tokens,
6 prompts a group × 2 seeds, draft_suffix γ=auto, the modes --quantize auto picks here for it (target and
draft). Every output is checked identical to seeded plain decoding.
"""
import statistics, sys, torch, specdec
import specdec.api
import specdec.engine as engine
from specdec.bench.datasets import load_prompts
from specdec.cpu import cpu_description
from specdec.drafters.suffix import clear_global_caches
torch.set_num_threads(2)
groups = sys.argv[1:] or ["humaneval", "mt_bench"]
plan = specdec.api.plan_execution("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "draft_suffix")
target = specdec.load_model("qwen2.5-coder-1.5b", quantize=plan.target_mode, prompt_quantize="auto")
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize=plan.draft_mode)
print("cpu", cpu_description(), "target", plan.target_mode, "draft", plan.draft_mode)
SOURCES = {"humaneval": ("humaneval", None), "mt_bench": ("spec_bench", ["mt_bench"])}
noisy = engine.chain_clocks
ARMS = {"chain": ("off", noisy), "tree by q": ("auto", lambda params, position, probs: None), "tree by noise": ("auto", noisy)}
for group in groups:
    rows = load_prompts(*SOURCES[group], 6)
    res = {}
    for row in rows:
        ids = specdec.api.encode_prompt(target, row.turns[0], chat=row.chat)
        for seed in (1, 2):
            params = specdec.SamplingParams(temperature=0.7, max_tokens=96, seed=seed, ignore_eos=True)
            clear_global_caches()
            plain = specdec.generate(target, ids, params)
            for name, (tree, clocks) in ARMS.items():
                engine.chain_clocks = clocks
                clear_global_caches()
                out = specdec.generate(target, ids, params, draft=draft,
                                       spec=specdec.SpecConfig(method="draft_suffix", num_speculative_tokens="auto", spec_tree=tree))
                assert out.token_ids == plain.token_ids, (row.id, seed, name)
                s = out.stats
                res.setdefault(name, []).append(((s.generated_tokens - 1) / s.decode_time_s, s.mean_accepted_len,
                                                 s.alternative_wins))
            engine.chain_clocks = noisy
    print(f"== {group} (6 prompts x 2 seeds, t=0.7, 96 tokens; every output identical to seeded plain decoding)")
    for name, values in res.items():
        tok, tau, wins = (statistics.median(c) for c in zip(*values))
        print(f"{name:14s} tok/s {tok:5.1f}  tau {tau:.2f}  alternative wins per request {sum(v[2] for v in values) / len(values):.1f}")
    for name in ("tree by q", "tree by noise"):
        ratios = [a[0] / b[0] for a, b in zip(res[name], res["chain"])]
        taus = [a[1] / b[1] for a, b in zip(res[name], res["chain"])]
        print(f"{name} / chain per pair: tok/s median {statistics.median(ratios):.3f}, tau median {statistics.median(taus):.3f}")
    print(flush=True)
