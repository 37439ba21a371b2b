from specdec.drafters.suffix import SuffixDrafter, FrequencyTable

def table_candidates(table: FrequencyTable, tokens, choices):
    out = []
    for depth in range(min(table.max_depth, len(tokens)), 0, -1):
        counter = table.table.get(tuple(tokens[-depth:]))
        if counter:
            total = sum(counter.values())
            out.append((depth, [(t, c / total) for t, c in counter.most_common(choices)]))
    return out

class Backoff(SuffixDrafter):
    """Tree children: continuations of every matching context length, not only the longest."""
    levels = 99
    def _predict(self, tokens, choices=1):
        if choices == 1:
            return super()._predict(tokens, choices)
        best = super()._predict(tokens, choices)
        if best is None:
            return None
        ranked, depth = best
        estimates = dict(ranked)
        seen_depths = 0
        for table in (self.local, self.cache.table):
            for d, cands in table_candidates(table, tokens, choices)[: self.levels]:
                b = self._bucket(d)
                rate = self.match_accepts[b] / self.match_trials[b]
                for t, share in cands:
                    if t not in estimates:
                        estimates[t] = share * rate * self.alt_weight
        merged = sorted(estimates.items(), key=lambda kv: -kv[1])[:choices]
        return merged, depth
    alt_weight = 1.0


def continuations_with_history(path, history):
    """train-drafter's generated.jsonl records (long enough to replay), and a shared table holding the
    first ``history`` of them (as SuffixDrafter.finish stores a request: the prompt's last 8 tokens on)."""
    import json
    from specdec.drafters.suffix import GlobalSuffixCache
    recs = [json.loads(line) for line in open(path)]
    recs = [r for r in recs if len(r["tokens"]) > r["prompt_tokens"] + 8]
    cache = GlobalSuffixCache()
    for r in recs[:history]:
        cache.add_request(r["tokens"][max(0, r["prompt_tokens"] - 8):])
    return recs, cache
