import sys
from collections import defaultdict
from backoff import table_candidates, continuations_with_history
from specdec.drafters.suffix import FrequencyTable, MATCH_PRIOR
path, history, measured = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
recs, cache = continuations_with_history(path, history)
rate = lambda d: MATCH_PRIOR[min(d, 8) - 1]
schemes = {
  "longest-then-max": None,
  "max share*rate": lambda per: max(per),
  "sum share*rate": lambda per: sum(per),
}
hits = {k: defaultdict(int) for k in schemes}; misses = 0
for r in recs[history:history+measured]:
    toks, p = r["tokens"], r["prompt_tokens"]
    local = FrequencyTable(8); local.add(toks[:p])
    for i in range(p, len(toks)):
        ctx = toks[max(0, i-8):i]; truth = toks[i]
        preds = [x for x in (t.predict(ctx, 3) for t in (local, cache.table)) if x]
        if preds:
            ranked, d = max(preds, key=lambda c: (c[1], c[0][0][1]))
            first = ranked[0][0]
            if first != truth:
                misses += 1
                per = defaultdict(list)
                longest = {}
                for t, s in ranked[1:]:
                    longest[t] = s * rate(d)
                for tb in (local, cache.table):
                    for dd, cs in table_candidates(tb, ctx, 10**6):
                        for t, s in cs:
                            if t != first:
                                per[t].append(s * rate(dd))
                for name, f in schemes.items():
                    if f is None:
                        sc = dict(longest)
                        for t, v in per.items():
                            if t not in sc:
                                sc[t] = max(v)
                        order = sorted(sc, key=lambda t: -sc[t])
                    else:
                        order = sorted(per, key=lambda t: -f(per[t]))
                    if truth in order[:5]:
                        hits[name][order.index(truth)] += 1
        local.add(toks[:i+1], start=i)
    cache.add_request(toks[max(0, p-8):])
print("misses", misses)
for name, h in hits.items():
    print(f"{name:20s}", " ".join(f"r{k+1}:{h[k]/misses:.3f}" for k in range(5)), f"top3 {sum(h[k] for k in range(3))/misses:.3f}")
