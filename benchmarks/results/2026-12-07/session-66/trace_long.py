"""Trace draft_suffix vs suffix on long documents: per prompt, rounds by who proposed, k history, draft time.

    .venv/bin/python benchmarks/results/2026-12-07/session-66/trace_long.py --quantize int8 --groups summarization --limit 6
"""
import argparse, statistics, sys, collections
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/, for interleaved.py
from interleaved import add_pair_args, load_pair, compare_to_plain
import specdec

p = argparse.ArgumentParser(); add_pair_args(p)
p.add_argument("--methods", default="draft_suffix,suffix")
args = p.parse_args()
target, draft = load_pair(args)
plan = {"plain": None}
for m in args.methods.split(","):
    plan[m] = specdec.SpecConfig(method=m, num_speculative_tokens="auto")
for group, results in compare_to_plain(target, draft, args, plan):
    for name, runs in results.items():
        for i, (speed, ratio, out) in enumerate(runs):
            s = out.stats
            ks = collections.Counter(s.gamma_history)
            free = sum(1 for r in s.rounds if r.drafted) 
            print(f"{group} {name:13s} p{i} {speed:5.1f} tok/s x{ratio:.2f} tau {s.mean_accepted_len:.2f} "
                  f"rounds {len(s.rounds)} drafted-rounds {free} dfwd {s.draft_forwards} draft_s {s.draft_time_s:.2f} "
                  f"verify_s {s.verify_time_s:.2f} decode_s {s.decode_time_s:.2f} ttft {s.ttft_s:.2f} "
                  f"k {dict(sorted(ks.items()))} note {s.speculation_note[:60]!r}", flush=True)
        if name != "plain":
            print(f"== {group} {name} median x{statistics.median(r for _, r, _ in runs):.2f}", flush=True)
