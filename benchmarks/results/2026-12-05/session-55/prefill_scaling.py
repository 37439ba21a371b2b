"""Time to first token (one prompt pass, the CLI's default execution: int4 target, int8 prompt twin)
against prompt length: standard-library source as the prompt, best of two after a warm-up.
    .venv/bin/python prefill_scaling.py 512 1024 2048 3072"""
import sys, time, torch
import specdec
from specdec.sampling import SamplingParams

target = specdec.load_model("qwen2.5-coder-1.5b")
import sysconfig, os
text = "".join(open(os.path.join(sysconfig.get_paths()["stdlib"], f)).read() for f in ("textwrap.py", "shlex.py", "queue.py", "heapq.py"))
ids = target.tokenizer.encode(text)
params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
for n in [int(x) for x in sys.argv[1:]] or [256, 512, 1024, 2048, 3072]:
    prompt = ids[:n]
    specdec.generate(target, prompt[:64], params)
    times = []
    for _ in range(2):
        t = time.perf_counter(); out = specdec.generate(target, prompt, params); times.append(time.perf_counter() - t)
    print(f"n={n} ttft={min(times):.2f}s  {n/min(times):.0f} tok/s  per-token {min(times)/n*1e3:.2f} ms", flush=True)
