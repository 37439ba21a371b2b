"""How often a seeded draft proposes the token the target's seeded choice takes, per coupling (session 61).

A seeded request whose text must not depend on γ, the drafter or the load needs each position's token
to be a function of (seed, position, target distribution) alone; the draft then proposes with the same
randomness and is accepted iff it matches. Which shared randomness matches most often?
- optimal: Σ min(p, q) — rejection sampling's acceptance (not γ-invariant; the reference)
- gumbel: argmax(log p + g) vs argmax(log q + g), g iid Gumbel per token id (Monte Carlo, 256 draws)
- inverse-cdf: one uniform per position through both CDFs in token-id order (exact overlap)
- independent: the draft samples on its own (Σ p q)
Teacher-forced over the target's own sampled continuation; prompts: 3 HumanEval + 3 MT-Bench.
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
totals = {"optimal": [], "gumbel": [], "inverse-cdf": [], "independent": []}
gen = torch.Generator().manual_seed(0)
for text, chat in prompts:
    ids = specdec.api.encode_prompt(target, text, chat=chat)
    out = specdec.generate(target, ids, specdec.SamplingParams(temperature=temperature, max_tokens=64, seed=1, ignore_eos=True))
    full = ids + out.token_ids
    lp, lq = rows(target, full, len(ids)), rows(draft, full, len(ids))
    p, q = lp.exp().double(), lq.exp().double()
    totals["optimal"].append(torch.minimum(p, q).sum(-1))
    totals["independent"].append((p * q).sum(-1))
    P, Q = p.cumsum(-1), q.cumsum(-1)
    lo = torch.maximum(P - p, Q - q); hi = torch.minimum(P, Q)
    totals["inverse-cdf"].append((hi - lo).clamp_min(0).sum(-1))
    hits = torch.zeros(p.shape[0], dtype=torch.float64)
    for _ in range(256):
        g = -torch.log(-torch.log(torch.rand(p.shape[-1], generator=gen).clamp(1e-12, 1 - 1e-12)))
        hits += ((lp + g).argmax(-1) == (lq + g).argmax(-1)).double()
    totals["gumbel"].append(hits / 256)
    print(text[:40].replace("\n", " "), {k: round(float(v[-1].mean()), 3) for k, v in totals.items()}, flush=True)
print("all positions:", {k: round(float(torch.cat(v).mean()), 3) for k, v in totals.items()})
