"""N HumanEval requests at once through generate_batch (int4 target + int4-all draft, γ fixed, speculation kept on),
the 4-bit AMX threshold at 8 rows vs 0 (VNNI), alternating; prints wall time per run and checks identical outputs.

    .venv/bin/python benchmarks/results/2026-12-04/session-47/batch_amx_ab.py REPEATS REQUESTS GAMMA
"""
import json, sys, time
import specdec
from specdec.kernels.build import kernel
from specdec.cpu import cpu_description

m = kernel()
repeats, requests, gamma = (int(a) for a in sys.argv[1:4])
prompts = [json.loads(l)["prompt"] for l in open("../shared/data/humaneval/humaneval_0_99.jsonl")][50:50 + requests]
target = specdec.load_model("qwen2.5-coder-1.5b", quantize="int4")
draft = specdec.load_model("qwen2.5-coder-0.5b", quantize="int4-all")
params = specdec.SamplingParams(temperature=0.0, max_tokens=48)
spec = specdec.SpecConfig(num_speculative_tokens=gamma, spec_tree="off")
print(f"# CPU {cpu_description()}; {requests} requests, γ={gamma}, 48 tokens each")
outs, times = {}, {0: [], 8: []}
for rep in range(repeats):
    for rows in ((0, 8) if rep % 2 == 0 else (8, 0)):
        m.set_q4_amx_min_rows(rows)
        t = time.perf_counter()
        res = specdec.generate_batch(target, prompts, params, draft=draft, spec=spec, max_num_seqs=requests,
                                     disable_speculation_above="never")
        times[rows].append(time.perf_counter() - t)
        outs[rows] = [r.text for r in res]
        print(f"AMX from {rows or 'never'}: {times[rows][-1]:.2f} s", flush=True)
print("same outputs:", outs[0] == outs[8])
print(f"VNNI / AMX (min to min): {min(times[0]) / min(times[8]):.3f}; per pair:",
      " ".join(f"{a / b:.3f}" for a, b in zip(times[0], times[8])))
m.set_q4_amx_min_rows(8)
