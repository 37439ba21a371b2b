import json, time, sys
import specdec
from specdec.kernels.build import kernel
from specdec.cpu import cpu_description
m = kernel()
prompts = [json.loads(l)["prompt"] for l in open("../shared/data/humaneval/humaneval_0_99.jsonl")][50:66]
target = specdec.load_model("qwen2.5-coder-1.5b", quantize="int4")
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
params = specdec.SamplingParams(temperature=0.0, max_tokens=48)
spec = specdec.SpecConfig(num_speculative_tokens=8)
print("# CPU", cpu_description())
outs = {}
times = {0: [], 64: []}
for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
    for rows in (0, 64) if rep % 2 == 0 else (64, 0):
        m.set_q4_amx_min_rows(rows)
        t = time.perf_counter()
        res = specdec.generate_batch(target, prompts, params, draft=draft, spec=spec, max_num_seqs=16, disable_speculation_above="never")
        times[rows].append(time.perf_counter() - t)
        outs[rows] = [r.text for r in res]
        print(rows, f"{times[rows][-1]:.1f} s", sum(len(r.token_ids) for r in res) if hasattr(res[0], "token_ids") else "", flush=True)
print("same outputs:", outs[0] == outs[64])
print("AMX off / on (min):", min(times[0]) / min(times[64]))
m.set_q4_amx_min_rows(64)
