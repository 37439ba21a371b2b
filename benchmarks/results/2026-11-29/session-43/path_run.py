"""One process on the kernel path SPECDEC_KERNEL_PATH names: make run's configuration (int4 target, int4-all
draft, draft_suffix γ=auto) vs plain int4 per prompt; 6 HumanEval + 6 MT-Bench prompts, 64 tokens, greedy.
Appends per-prompt rows to the JSON-lines file argv[1] (session 43)."""
import json, os, sys, torch, specdec
from specdec.drafters.suffix import clear_global_caches
from specdec.bench.datasets import load_prompts
from specdec.kernels.build import kernel_path
torch.set_num_threads(2)
target = specdec.load_model("qwen2.5-coder-1.5b", quantize="int4", prompt_quantize="auto")
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
params = specdec.SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
spec = specdec.SpecConfig(method="draft_suffix", num_speculative_tokens="auto")
curve = {k: round(v * 1e3, 1) for k, v in target.backend.step_seconds.items() if k in (1, 2, 3, 5, 9)}
with open(sys.argv[1], "a") as out:
    for group, rows in {"humaneval": load_prompts("humaneval", None, 6), "mt_bench": load_prompts("spec_bench", ["mt_bench"], 6)}.items():
        for i, row in enumerate(rows):
            ids = specdec.api.encode_prompt(target, row.turns[0], chat=row.chat)
            plain = specdec.generate(target, ids, params)
            clear_global_caches()
            sp = specdec.generate(target, ids, params, draft=draft, spec=spec)
            assert sp.token_ids == plain.token_ids
            out.write(json.dumps({"path": kernel_path(), "group": group, "prompt": i, "plain": plain.stats.tokens_per_s,
                                  "spec": sp.stats.tokens_per_s, "tau": sp.stats.mean_accepted_len, "curve": curve}) + "\n")
