"""Time to first token of the first long6 prompt (benchmarks/long_context_prompts.py --out /tmp/long6.jsonl), three
times, with the prompt attention kind argv[1] (float32 | avx512-bf16); run under `perf record -g -D 14000` for
prefill-profile.txt.
    .venv/bin/python ttft_profile.py float32"""
import json, sys, time, torch
import specdec
torch.set_num_threads(2)
t = specdec.load_model("qwen2.5-coder-1.5b", quantize="int4", prompt_quantize="auto")
ops = t.backend.prompt_backend.decoder.layer_runner.ops
ops.set_prompt_attention_kind(sys.argv[1])
row = json.loads(open("/tmp/long6.jsonl").readline())
ids = specdec.api.encode_prompt(t, row["prompt"], chat=True)
p = specdec.SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
for _ in range(3):
    s = time.perf_counter(); out = specdec.generate(t, ids, p); print(sys.argv[1], len(ids), round(time.perf_counter() - s, 2), out.stats.ttft_s, flush=True)
