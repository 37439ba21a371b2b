"""End to end on long prompts: the attention before this session (7b62c83's kernels, loaded as a second
extension module) vs now, same process, per prompt alternating (before, after, after, before), plain and
draft_suffix decoding at γ (a number: both builds then verify the same chunks; "auto": the controller's).

    .venv/bin/python benchmarks/results/2026-11-29/session-45/long_prompts_ab.py summarization 6 64 int8 8
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import specdec  # noqa: E402
from benchmarks.kernel_ab import base_kernels  # noqa: E402
from specdec.api import encode_prompt  # noqa: E402
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.config import SpecConfig  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402
from specdec.drafters.suffix import clear_global_caches  # noqa: E402
from specdec.kernels import build  # noqa: E402
from specdec.sampling import SamplingParams  # noqa: E402

group, limit, tokens, mode, gamma = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
gamma = gamma if gamma == "auto" else int(gamma)
rows = load_prompts("spec_bench", [group], limit, None) if group != "humaneval" else load_prompts(group, None, limit, None)
base = base_kernels("7b62c83")
with build.layers_built_with(base):
    before = specdec.load_model("qwen2.5-coder-1.5b", quantize=mode)
after = specdec.load_model("qwen2.5-coder-1.5b", quantize=mode)
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
print(f"# {cpu_description()}; target {mode}, draft int4-all, {group}, {tokens} new tokens, draft_suffix γ={gamma}")
print("| prompt | prompt tokens | plain before | plain after | after ÷ before | spec before | spec after | after ÷ before | τ | verify ms before | verify ms after |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
ratios = {"plain": [], "spec": []}
for index, row in enumerate(rows):
    ids = encode_prompt(after, row.turns[0], chat=row.chat)
    rates, outputs, verify = {}, {}, {}
    for method in (None, "draft_suffix"):
        order = [("before", before), ("after", after), ("after", after), ("before", before)]
        for name, target in order if method else order[:2]:
            clear_global_caches()
            spec = SpecConfig(method=method, num_speculative_tokens=gamma) if method else None
            out = specdec.generate(target, ids, params, draft=draft if method else None, spec=spec)
            rates.setdefault((method, name), []).append(out.stats.tokens_per_s)
            verify.setdefault((method, name), []).append(out.stats.verify_time_s / max(out.stats.target_forwards, 1))
            outputs[(method, name)] = out
    rates = {key: statistics.median(values) for key, values in rates.items()}
    verify = {key: statistics.median(values) * 1e3 for key, values in verify.items()}
    tau = outputs[("draft_suffix", "after")].stats.mean_accepted_len
    plain = rates[(None, "after")] / rates[(None, "before")]
    spec = rates[("draft_suffix", "after")] / rates[("draft_suffix", "before")]
    ratios["plain"].append(plain)
    ratios["spec"].append(spec)
    print(f"| {row.id} | {len(ids)} | {rates[(None, 'before')]:.1f} | {rates[(None, 'after')]:.1f} | {plain:.3f} | "
          f"{rates[('draft_suffix', 'before')]:.1f} | {rates[('draft_suffix', 'after')]:.1f} | {spec:.3f} | {tau:.2f} | "
          f"{verify[('draft_suffix', 'before')]:.1f} | {verify[('draft_suffix', 'after')]:.1f} |",
          flush=True)
print(f"\nmedian after ÷ before: plain {statistics.median(ratios['plain']):.3f}, "
      f"spec {statistics.median(ratios['spec']):.3f} ({len(rows)} prompts; tok/s is decode after the prompt)")
