"""Per-round view of draft_suffix and suffix alone on long documents: who proposed each round, the table's estimate of
its first token, and how many tokens the round had accepted — does an untrusted table proposal (estimate < 0.5, which
draft_suffix hands to the draft model) commit more than the draft model's round does there?

    .venv/bin/python benchmarks/results/2026-12-07/session-66/round_types.py --quantize int8 --groups summarization --limit 6
"""
import argparse, collections, statistics, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]) if "results" in __file__ else "/work/main/benchmarks")
from interleaved import add_pair_args, load_pair, compare_to_plain
import specdec
from specdec.drafters.draft_suffix import SuffixAssistedDrafter
from specdec.drafters.suffix import SuffixDrafter

log: list[tuple[str, float | None, int, int]] = []  # (who, table estimate, proposed, accepted)
pending: dict[int, tuple[str, float | None, int]] = {}

original_propose = SuffixDrafter.propose
def propose(self, context_ids, k):
    draft = original_propose(self, context_ids, k)
    self._probe = (draft.prefix_accept[0] if draft.prefix_accept else None, len(draft.tokens))
    return draft
SuffixDrafter.propose = propose

original_suffix_accepted = SuffixDrafter.accepted
def suffix_accepted(self, num_accepted, next_token):
    estimate, proposed = getattr(self, "_probe", (None, 0))
    if not getattr(self, "_inside", False):
        log.append(("suffix-alone", estimate, proposed, num_accepted))
    return original_suffix_accepted(self, num_accepted, next_token)
SuffixDrafter.accepted = suffix_accepted

original_ds_accepted = SuffixAssistedDrafter.accepted
def ds_accepted(self, num_accepted, next_token):
    estimate, proposed = getattr(self.suffix, "_probe", (None, 0))
    who = "table" if self._last is self.suffix else "model" if self._last is self.draft else "none"
    log.append((f"draft_suffix:{who}", estimate, proposed, num_accepted))
    self.suffix._inside = True
    try:
        return original_ds_accepted(self, num_accepted, next_token)
    finally:
        self.suffix._inside = False
SuffixAssistedDrafter.accepted = ds_accepted

p = argparse.ArgumentParser(); add_pair_args(p)
args = p.parse_args()
target, draft = load_pair(args)
plan = {"plain": None, "draft_suffix": specdec.SpecConfig(method="draft_suffix", num_speculative_tokens="auto"),
        "suffix": specdec.SpecConfig(method="suffix", num_speculative_tokens="auto")}
for group, results in compare_to_plain(target, draft, args, plan):
    for name in ("draft_suffix", "suffix"):
        runs = results[name]
        print(f"{group} {name}: × plain median {statistics.median(r for _, r, _ in runs):.2f}, "
              f"τ median {statistics.median(o.stats.mean_accepted_len for _, _, o in runs):.2f}, "
              f"draft forwards median {statistics.median(o.stats.draft_forwards or 0 for _, _, o in runs)}", flush=True)
buckets = collections.defaultdict(list)
for who, estimate, proposed, accepted in log:
    band = "none" if estimate is None else "trusted (>=0.5)" if estimate >= 0.5 else "untrusted (<0.5)"
    buckets[(who, band if who != "draft_suffix:model" else band)].append((proposed, accepted))
print("| round kind | table's first-token estimate | rounds | mean proposed | mean accepted |")
print("|---|---|---|---|---|")
for (who, band), rows in sorted(buckets.items()):
    print(f"| {who} | {band} | {len(rows)} | {statistics.mean(p for p, _ in rows):.2f} | {statistics.mean(a for _, a in rows):.2f} |")
