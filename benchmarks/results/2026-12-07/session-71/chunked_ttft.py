"""Time to first token of long6 prompts, float32 vs avx512-bf16 prompt attention, kinds alternating first per
prompt; int4 target with its int8 prompt twin. `chunked`: through generate_batch with the server's 256-token
prefill chunks (the bf16 kernel repacks the cache's keys/values every chunk); `whole`: specdec.generate, one pass.
Prints per prompt and the paired median.
    .venv/bin/python chunked_ttft.py /tmp/long6.jsonl chunked|whole"""
import json, statistics, sys, time, torch
import specdec
from specdec.cpu import cpu_description
torch.set_num_threads(2)
target = specdec.load_model("qwen2.5-coder-1.5b", quantize="int4", prompt_quantize="auto")
ops = target.backend.prompt_backend.decoder.layer_runner.ops
params = specdec.SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
rows = [json.loads(line)["prompt"] for line in open(sys.argv[1])]
whole = sys.argv[2] == "whole"
print(f"# {cpu_description()}; {'generate (one pass)' if whole else 'generate_batch(prefill_chunk=256)'}, max_tokens=1", flush=True)
ratios = []
for number, text in enumerate(rows):
    ids = specdec.api.encode_prompt(target, text, chat=True)
    seconds = {}
    for kind in (("float32", "avx512-bf16") if number % 2 == 0 else ("avx512-bf16", "float32")):
        ops.set_prompt_attention_kind(kind)
        began = time.perf_counter()
        if whole:
            specdec.generate(target, ids, params)
        else:
            specdec.generate_batch(target, [ids], params, prefill_chunk=256)
        seconds[kind] = time.perf_counter() - began
    ratios.append(seconds["avx512-bf16"] / seconds["float32"])
    print(f"prompt {number}: {len(ids)} tokens, float32 {seconds['float32']:.2f} s, avx512-bf16 {seconds['avx512-bf16']:.2f} s", flush=True)
print(f"median bf16 / float32: {statistics.median(ratios):.3f}")
