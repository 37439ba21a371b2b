"""The offline batch API's speculation policy, on the same prompts in one process: generate_batch at
C requests in flight (MT-Bench first turns as chat, 64 tokens, greedy) without speculation, with
speculation as before the policy (every request drafting at its own γ, no pause for prompts), and as
now (``disable_speculation_above="auto"``, pause for prompts). The suffix and prefix caches are emptied
before every run; the three configurations must give the same token ids (asserted).

    .venv/bin/python benchmarks/generate_batch_policy.py --concurrency 8 --prompts 16 --repeats 3
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdec.api import enable_prefix_caching, load_model  # noqa: E402
from specdec.batch import generate_batch  # noqa: E402
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.config import SpecConfig  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402
from specdec.drafters.suffix import clear_global_caches  # noqa: E402
from specdec.sampling import SamplingParams  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (max_num_seqs)")
parser.add_argument("--prompts", type=int, default=16, help="prompts per repetition (each repetition new ones)")
parser.add_argument("--repeats", type=int, default=3)
args = parser.parse_args()
C, N, REPS = args.concurrency, args.prompts, args.repeats
rows = load_prompts("spec_bench", categories=["mt_bench"])
prompts = [[{"role": "user", "content": r.turns[0]}] for r in rows]
target = load_model("qwen2.5-coder-1.5b", quantize="int8")
draft = load_model("qwen2.5-coder-0.5b", quantize="int4-all")
caches = [enable_prefix_caching(target), enable_prefix_caching(draft)]
spec = SpecConfig(method="draft_suffix", num_speculative_tokens="auto")
params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
configs = {"off": dict(spec=None, draft=None),
           "on, before": dict(spec=spec, draft=draft, disable_speculation_above="never", pause_speculation_for_prompts=False),
           "on, now": dict(spec=spec, draft=draft)}
print(f"# generate_batch, {C} in flight, {N} MT-Bench first turns per repetition (chat), 64 tokens, greedy; CPU {cpu_description()}")
print("| repetition | config | tok/s | median TTFT s | drafted tokens |\n|---|---|---|---|---|")
res = {k: [] for k in configs}
answers = {}
for rep in range(REPS):
    ps = prompts[rep * N:(rep + 1) * N]
    order = list(configs) if rep % 2 == 0 else list(reversed(configs))
    for name in order:
        clear_global_caches(); [c.reset() for c in caches]
        t = time.perf_counter()
        out = generate_batch(target, ps, params, chat=True, max_num_seqs=C, **configs[name])
        wall = time.perf_counter() - t
        toks = sum(len(r.token_ids) for r in out)
        ttft = statistics.median(r.stats.ttft_s for r in out)
        drafted = sum(sum(len(x.drafted) for x in r.stats.rounds) for r in out)
        ids = [r.token_ids for r in out]
        assert answers.setdefault(rep, ids) == ids, "outputs differ between configs"
        res[name].append(toks / wall)
        print(f"| {rep} | {name} | {toks/wall:.1f} | {ttft:.3f} | {drafted} |", flush=True)
print("\n| config | median tok/s | × off |\n|---|---|---|")
base = statistics.median(res["off"])
for name in configs:
    m = statistics.median(res[name])
    print(f"| {name} | {m:.1f} | {m / base:.2f} |")
