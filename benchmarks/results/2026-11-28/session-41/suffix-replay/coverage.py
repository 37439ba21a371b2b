import sys
from backoff import table_candidates, continuations_with_history
from specdec.drafters.suffix import FrequencyTable
path, history, measured = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
recs, cache = continuations_with_history(path, history)
stats = dict(n=0, none=0, top1=0, top3=0, backoff3=0, anyctx=0)
for r in recs[history:history+measured]:
    toks, p = r["tokens"], r["prompt_tokens"]
    local = FrequencyTable(8); local.add(toks[:p])
    for i in range(p, len(toks)):
        ctx = toks[max(0, i-8):i]; truth = toks[i]
        stats["n"] += 1
        preds = [t.predict(ctx, 3) for t in (local, cache.table)]
        preds = [x for x in preds if x]
        if not preds:
            stats["none"] += 1
        else:
            ranked, d = max(preds, key=lambda c: (c[1], c[0][0][1]))
            stats["top1"] += ranked[0][0] == truth
            stats["top3"] += truth in [t for t, _ in ranked]
            cands = set(); anyc = set()
            for tb in (local, cache.table):
                for dd, cs in table_candidates(tb, ctx, 3):
                    cands.update(t for t, _ in cs)
                for dd, cs in table_candidates(tb, ctx, 10**6):
                    anyc.update(t for t, _ in cs)
            stats["backoff3"] += truth in cands
            stats["anyctx"] += truth in anyc
        local.add(toks[:i+1], start=i)
    cache.add_request(toks[max(0, p-8):])
n = stats["n"]; print({k: round(v/n, 3) for k, v in stats.items()}, n)
