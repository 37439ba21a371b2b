import sys, collections
import specdec
from specdec.api import encode_prompt
from specdec.bench.datasets import load_prompts
from specdec.config import SpecConfig
from specdec.sampling import SamplingParams
from specdec.drafters.suffix import clear_global_caches
from specdec.drafters import draft_suffix as DS
mode, group, ids_wanted = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
rows = load_prompts("spec_bench", [group], 10, None) if group != "humaneval" else load_prompts(group, None, 10, None)
rows = [r for r in rows if r.id in ids_wanted]
target = specdec.load_model("qwen2.5-coder-1.5b", quantize=mode)
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
log = []
orig = DS.SuffixAssistedDrafter.propose_steps
def patched(self, context_ids, k):
    before = (self.suffix_rounds, self.draft_rounds)
    d = yield from orig(self, context_ids, k)
    who = "suffix" if self.suffix_rounds > before[0] else ("model" if self.draft_rounds > before[1] else "none")
    log.append((who, k, len(d.tokens)))
    return d
DS.SuffixAssistedDrafter.propose_steps = patched
params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
for row in rows:
    log.clear(); clear_global_caches()
    ids = encode_prompt(target, row.turns[0], chat=row.chat)
    out = specdec.generate(target, ids, params, draft=draft, spec=SpecConfig(method="draft_suffix", num_speculative_tokens="auto"))
    rounds = out.stats.rounds
    print(row.id, mode, "tok/s", round(out.stats.tokens_per_s, 1), "rounds", len(rounds), "log", len(log))
    by = collections.defaultdict(lambda: [0, 0, 0])
    for (who, k, n), r in zip(log, rounds):
        by[(who, n)][0] += 1; by[(who, n)][1] += r.accepted
    for key in sorted(by): print("  ", key, "rounds", by[key][0], "accepted", by[key][1])
