"""TTFT of the long-code prompts (one prompt pass + 1 token), each twice; prints per prompt best time."""
import sys, time, json, torch, os
import specdec
torch.set_num_threads(2)
target = specdec.load_model("qwen2.5-coder-1.5b")
rows = [json.loads(l) for l in open("/tmp/long_code.jsonl")]
params = specdec.SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
specdec.generate(target, "warm up " * 40, params)
res = []
for row in rows:
    ids = specdec.api.encode_prompt(target, row["prompt"], chat=True)
    best = 1e9
    for _ in range(2):
        t = time.perf_counter(); specdec.generate(target, ids, params); best = min(best, time.perf_counter() - t)
    res.append((len(ids), best))
print(sys.argv[1], json.dumps(res), flush=True)
