"""A short streamed request sent 1.5 s after a long prompt: its total time and the long prompt's TTFT, per server."""
import json, sys, threading, time, urllib.request
ports = [int(p) for p in sys.argv[1].split(",")]
repeats = int(sys.argv[2])
M = "qwen2.5-coder-1.5b"
sb = [json.loads(l) for l in open('/work/shared/data/spec_bench/question.jsonl')]
docs = [r['turns'][0] for r in sb if r['category'] in ('summarization', 'rag')]
def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time(); ttft = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                j = json.loads(line[5:])
                if j.get("choices") and j["choices"][0].get("text") and ttft is None:
                    ttft = time.time() - t0
    return ttft, time.time() - t0
def tokens(port, text):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=json.dumps({"model": M, "prompt": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())["count"]
for port in ports:
    for _ in range(120):
        try: urllib.request.urlopen(f"http://127.0.0.1:{port}/health"); break
        except Exception: time.sleep(2)
for rep in range(repeats):
    parts = []
    for d in docs[rep * 7:]:
        parts.append(d)
        if tokens(ports[0], "\n\n".join(parts)) >= 3300: break
    long_prompt = "\n\n".join(parts)
    for port in ports:
        res = {}
        def run(key, body, delay):
            time.sleep(delay); res[key] = post(port, body)
        ths = [threading.Thread(target=run, args=("long", {"model": M, "prompt": long_prompt, "max_tokens": 16, "temperature": 0, "stream": True}, 0)),
               threading.Thread(target=run, args=("short", {"model": M, "prompt": f"def reverse_{rep}(s):", "max_tokens": 16, "temperature": 0, "stream": True, "ignore_eos": True}, 1.5))]
        for t in ths: t.start()
        for t in ths: t.join()
        print(f"rep {rep} port {port}: long ttft {res['long'][0]:.2f}s total {res['long'][1]:.2f}s | short ttft {res['short'][0]:.2f}s total {res['short'][1]:.2f}s", flush=True)
