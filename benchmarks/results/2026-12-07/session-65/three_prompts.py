"""Three long prompts sent together (0.2 s apart): each one's time to first token, per server (A/B, alternating).

Usage: python three_prompts.py PORT[,PORT...] REPEATS [TOKENS]  — servers started with the same flags."""
import json, sys, threading, time, urllib.request
ports = [int(p) for p in sys.argv[1].split(",")]
repeats = int(sys.argv[2])
target_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 1500
M = "qwen2.5-coder-1.5b"
sb = [json.loads(l) for l in open('/work/shared/data/spec_bench/question.jsonl')]
docs = [r['turns'][0] for r in sb if r['category'] in ('summarization', 'rag')]
def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time(); ttft = None
    with urllib.request.urlopen(req, timeout=900) as r:
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
    for _ in range(300):
        try: urllib.request.urlopen(f"http://127.0.0.1:{port}/health"); break
        except Exception: time.sleep(2)
start = 0
for rep in range(repeats):
    prompts = []
    for _ in range(3):
        parts = []
        while start < len(docs):
            parts.append(docs[start]); start += 1
            if tokens(ports[0], "\n\n".join(parts)) >= target_tokens: break
        prompts.append(f"Request {rep}.{len(prompts)}\n\n" + "\n\n".join(parts))
    for port in ports:
        res = {}
        def run(i, delay):
            time.sleep(delay)
            res[i] = post(port, {"model": M, "prompt": prompts[i], "max_tokens": 8, "temperature": 0, "stream": True})
        ths = [threading.Thread(target=run, args=(i, 0.2 * i)) for i in range(3)]
        for t in ths: t.start()
        for t in ths: t.join()
        print(f"rep {rep} port {port}: TTFT " + " / ".join(f"{res[i][0]:.1f}" for i in range(3)) + " s "
              f"(prompts {', '.join(str(tokens(port, p)) for p in prompts)} tokens)", flush=True)
