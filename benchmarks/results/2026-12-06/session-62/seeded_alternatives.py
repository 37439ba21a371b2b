"""Seeded requests: would a second drafted candidate catch the target's choice, and which one? (session 62)

A seeded request commits argmax p(x)/E_x at each position (specdec/seeded.py); the draft proposes
argmax q(x)/E_x with the same clocks and is accepted iff it matches. Where it misses, an alternative
sibling wins iff it is the target's choice. Candidates for that sibling:
- by q: the draft's likeliest other tokens (what specdec/alternatives.py offers today, from q alone)
- by noise: the draft's runners-up under the same clocks, argmax q/E over the rest
Teacher-forced over the target's own seeded continuation (64 tokens), 3 HumanEval + 3 MT-Bench prompts,
Monte Carlo over 128 clock draws per position; int8 pair.
"""
import sys, torch, specdec
from specdec.bench.datasets import load_prompts
from specdec.cpu import cpu_description
torch.set_num_threads(2)
temperature = float(sys.argv[1]) if len(sys.argv) > 1 else 0.7
target = specdec.load_model("qwen2.5-coder-1.5b", quantize="int8")
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int8")
print("cpu", cpu_description(), "temperature", temperature)


@torch.no_grad()
def rows(model, ids, start):
    decoder = model.backend.decoder
    logits = decoder(torch.tensor(ids), torch.arange(len(ids)), decoder.new_cache(len(ids) + 8))
    return (logits[start - 1 : -1].float() / temperature).log_softmax(-1)


prompts = [(r.turns[0], r.chat) for r in load_prompts("humaneval", None, 3)] + \
          [(r.turns[0], r.chat) for r in load_prompts("spec_bench", ["mt_bench"], 3)]
keys = ["first", "+1 by q", "+2 by q", "+1 by noise", "+2 by noise"]
totals = {k: [] for k in keys}
gen = torch.Generator().manual_seed(0)
draws = 128
for text, chat in prompts:
    ids = specdec.api.encode_prompt(target, text, chat=chat)
    out = specdec.generate(target, ids, specdec.SamplingParams(temperature=temperature, max_tokens=64, seed=1, ignore_eos=True))
    full = ids + out.token_ids
    lp, lq = rows(target, full, len(ids)), rows(draft, full, len(ids))
    by_q = lq.topk(3, dim=-1).indices  # [T, 3]
    hits = {k: torch.zeros(lp.shape[0], dtype=torch.float64) for k in keys}
    for _ in range(draws):
        g = -torch.log(-torch.log(torch.rand(lp.shape[-1], generator=gen).clamp(1e-12, 1 - 1e-12)))
        chosen = (lp + g).argmax(-1)  # [T]: the target's seeded tokens under these clocks
        noisy = (lq + g).topk(3, dim=-1).indices  # [T, 3]: the draft's first three under the same clocks
        first = noisy[:, 0]
        hit = chosen == first
        hits["first"] += hit.double()
        # alternatives by q: q's likeliest tokens other than the drafted one, in order
        alt_q1 = torch.where(by_q[:, 0] == first, by_q[:, 1], by_q[:, 0])
        alt_q2 = torch.where((by_q[:, 0] == first) | (by_q[:, 1] == first), by_q[:, 2], by_q[:, 1])
        hits["+1 by q"] += (hit | (chosen == alt_q1)).double()
        hits["+2 by q"] += (hit | (chosen == alt_q1) | (chosen == alt_q2)).double()
        hits["+1 by noise"] += (hit | (chosen == noisy[:, 1])).double()
        hits["+2 by noise"] += (hit | (chosen == noisy[:, 1]) | (chosen == noisy[:, 2])).double()
    for k in keys:
        totals[k].append(hits[k] / draws)
    print(text[:40].replace("\n", " "), {k: round(float(v[-1].mean()), 3) for k, v in totals.items()}, flush=True)
print("all positions:", {k: round(float(torch.cat(v).mean()), 3) for k, v in totals.items()})
