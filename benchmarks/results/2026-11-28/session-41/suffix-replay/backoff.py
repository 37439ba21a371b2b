"""Session 41's suffix-tree variant (siblings from shorter matching contexts, each table's ``levels``
longest) and the loader the replay scripts share. Session 28's variant, which merges both tables'
counts at every length, is ``benchmarks/suffix_replay.py``'s BackoffSuffixDrafter."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))  # the repository root

from specdec.drafters.suffix import FrequencyTable, GlobalSuffixCache, SuffixDrafter  # noqa: E402

#: a finished request enters the shared table with its prompt's last tokens as context (SuffixDrafter.finish)
PROMPT_CONTEXT = 8


def table_candidates(table: FrequencyTable, tokens, choices):
    """(match length, [(token, share)] of its ``choices`` most frequent) for every context of
    ``tokens`` the table knows, longest first."""
    out = []
    for depth in range(min(table.max_depth, len(tokens)), 0, -1):
        counter = table.table.get(tuple(tokens[-depth:]))
        if counter:
            total = sum(counter.values())
            out.append((depth, [(t, c / total) for t, c in counter.most_common(choices)]))
    return out


class Backoff(SuffixDrafter):
    """Tree children: the longest match's continuations, then those of each table's ``levels``
    longest matching contexts (share × that length's acceptance rate)."""
    levels = 99

    def _predict(self, tokens, choices=1):
        best = super()._predict(tokens, choices)
        if choices == 1 or best is None:
            return best
        ranked, depth = best
        estimates = dict(ranked)
        for table in (self.local, self.cache.table):
            for d, cands in table_candidates(table, tokens, choices)[: self.levels]:
                b = self._bucket(d)
                rate = self.match_accepts[b] / self.match_trials[b]
                for t, share in cands:
                    estimates.setdefault(t, share * rate)
        return sorted(estimates.items(), key=lambda kv: -kv[1])[:choices], depth


def read_continuations(path):
    """train-drafter's generated.jsonl records long enough to replay."""
    records = [json.loads(line) for line in open(path)]
    return [r for r in records if len(r["tokens"]) > r["prompt_tokens"] + 8]


def table_of(records):
    """A shared suffix table holding ``records`` as SuffixDrafter.finish stores a request."""
    cache = GlobalSuffixCache()
    for r in records:
        cache.add_request(r["tokens"][max(0, r["prompt_tokens"] - PROMPT_CONTEXT):])
    return cache


def continuations_with_history(path, history):
    """The records, and a shared table holding the first ``history`` of them."""
    records = read_continuations(path)
    return records, table_of(records[:history])
