"""int4 vs int8 target with draft_suffix γ=auto: per request τ, γ history, draft forwards, times."""
import sys, statistics, collections, time
import specdec
from specdec.api import encode_prompt
from specdec.bench.datasets import load_prompts
from specdec.config import SpecConfig
from specdec.sampling import SamplingParams
from specdec.drafters.suffix import clear_global_caches
group = sys.argv[1]; limit = int(sys.argv[2]); tokens = int(sys.argv[3])
rows = load_prompts("spec_bench", [group], limit, None) if group != "humaneval" else load_prompts(group, None, limit, None)
targets = {m: specdec.load_model("qwen2.5-coder-1.5b", quantize=m) for m in ("int4", "int8")}
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
for row in rows:
    for mode, target in targets.items():
        ids = encode_prompt(target, row.turns[0], chat=row.chat)
        for method in (None, "draft_suffix"):
            clear_global_caches()
            spec = SpecConfig(method=method, num_speculative_tokens="auto") if method else None
            out = specdec.generate(target, ids, params, draft=draft if method else None, spec=spec)
            s = out.stats
            if method is None:
                print(f"{row.id:14s} {mode} plain tok/s {s.tokens_per_s:5.1f} ttft {s.ttft_s:.2f} prompt {s.prompt_tokens}", flush=True); continue
            hist = collections.Counter(s.gamma_history)
            print(f"{row.id:14s} {mode} spec  tok/s {s.tokens_per_s:5.1f} tau {s.mean_accepted_len:4.2f} rounds {s.target_forwards} "
                  f"proposed {s.proposed_tokens} accepted {s.accepted_tokens} draft_fwd {s.draft_forwards} "
                  f"draft_s {s.draft_time_s:.2f} verify_s {s.verify_time_s:.2f} decode_s {s.decode_time_s:.2f} "
                  f"gammas {sorted(hist.items())} ttft {s.ttft_s:.2f}", flush=True)
