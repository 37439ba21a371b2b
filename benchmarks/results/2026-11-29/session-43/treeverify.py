"""Chain-shaped verification: chain forward vs tree forward (+keep) of the same nodes (session 43)."""
import sys, time, statistics, torch, specdec
from specdec.tree import TreeLayout
torch.set_num_threads(2)
mode = sys.argv[1]
m = specdec.load_model("qwen2.5-coder-1.5b", quantize=mode, prompt_quantize=None if mode == "int8" else "auto")
b = m.backend
prompt = list(range(1000, 1300))
def one(state, tree, n, i):
    L = state.seq_len
    toks = [2000 + i + j for j in range(n + 1)]
    t = time.perf_counter()
    if tree:
        b.forward(state, toks, tree=TreeLayout(L, [-1, *range(n)]))
        state.keep(list(range(n + 1)), L)
    else:
        b.forward(state, toks)
    dt = time.perf_counter() - t
    state.truncate(L + 1)
    return dt
for n in (1, 2, 4):
    state = b.new_state(1024)
    b.forward(state, prompt, num_logits=1)
    c, t = [], []
    for i in range(40):
        c.append(one(state, False, n, i)); t.append(one(state, True, n, i))
    ratio = statistics.median(b_ / a for a, b_ in zip(c[4:], t[4:]))
    print(mode, "nodes", n, "chain ms %.1f tree ms %.1f  tree/chain paired %.3f" % (statistics.median(c[4:]) * 1e3, statistics.median(t[4:]) * 1e3, ratio), flush=True)
