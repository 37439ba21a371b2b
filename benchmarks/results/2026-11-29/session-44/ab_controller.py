"""A/B in one process: the γ controller as is vs (no backoff reset on an accepted exploration + optimistic
rounds capped at one token), draft_suffix γ=auto, plain as reference, interleaved per prompt."""
import sys, statistics
import specdec, specdec.adaptive as A
from specdec.adaptive import GammaController
from specdec.api import encode_prompt
from specdec.bench.datasets import load_prompts
from specdec.config import SpecConfig
from specdec.sampling import SamplingParams
from specdec.drafters.suffix import clear_global_caches
mode = sys.argv[1]; groups = sys.argv[2].split(","); limit = int(sys.argv[3])
orig_update, orig_choose = GammaController.update, GammaController.choose
def new_update(self, proposed, accepted, draft_s, verify_s):
    wait = self._explore_wait
    orig_update(self, proposed, accepted, draft_s, verify_s)
    self._explore_wait = wait
def new_choose(self):
    k = orig_choose(self)
    return min(k, 1) if self.optimistic and self._trials_seen < A.TRIALS_TO_JUDGE else k
target = specdec.load_model("qwen2.5-coder-1.5b", quantize=mode, prompt_quantize="auto")
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
for group in groups:
    rows = load_prompts("spec_bench", [group], limit, None) if group != "humaneval" else load_prompts(group, None, limit, None)
    ratios = {"old": [], "new": []}
    for i, row in enumerate(rows):
        ids = encode_prompt(target, row.turns[0], chat=row.chat)
        order = ["plain", "old", "new"] if i % 2 == 0 else ["plain", "new", "old"]
        res = {}
        for which in order:
            clear_global_caches()
            GammaController.update, GammaController.choose = (new_update, new_choose) if which == "new" else (orig_update, orig_choose)
            spec = None if which == "plain" else SpecConfig(method="draft_suffix", num_speculative_tokens="auto")
            out = specdec.generate(target, ids, params, draft=None if which == "plain" else draft, spec=spec)
            res[which] = out.stats.tokens_per_s
        GammaController.update, GammaController.choose = orig_update, orig_choose
        for w in ("old", "new"): ratios[w].append(res[w] / res["plain"])
        print(f"{group} {row.id} plain {res['plain']:.1f} old {res['old']:.1f} new {res['new']:.1f}", flush=True)
    print(f"== {group} {mode}: median x plain old {statistics.median(ratios['old']):.3f} new {statistics.median(ratios['new']):.3f}; "
          f"new/old per prompt median {statistics.median(n / o for n, o in zip(ratios['new'], ratios['old'])):.3f}", flush=True)
