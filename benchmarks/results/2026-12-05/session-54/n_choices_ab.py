import subprocess, sys, time, httpx, statistics, os, json
sys.path.insert(0, "/work/main")
from tests.test_server import free_port
def start(root):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": root}
    p = subprocess.Popen([f"{root}/.venv/bin/python", "-m", "specdec.cli", "serve", "--model", "qwen2.5-coder-1.5b", "--draft-model", "qwen2.5-coder-0.5b", "--port", str(port), "--max-concurrency", "8"], cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200: return p, base
        except httpx.HTTPError: time.sleep(0.5)
    raise RuntimeError(p.stderr.read())
rows = [json.loads(l) for l in open("/work/shared/data/spec_bench/question.jsonl")]
prompts = [r["turns"][0] for r in rows if r.get("category") in ("summarization", "rag")][:6]
servers = {"before": start("/tmp/old-wt"), "after": start("/work/main")}
res = {k: [] for k in servers}
for i, prompt in enumerate(prompts):
    for name, (p, base) in servers.items():
        httpx.post(base + "/reset_prefix_cache"); httpx.post(base + "/reset_suffix_cache")
        t = time.time()
        r = httpx.post(base + "/v1/chat/completions", timeout=600, json={"messages": [{"role": "user", "content": prompt}], "n": 4, "max_tokens": 32, "temperature": 0.8, "seed": i}).json()
        el = time.time() - t
        res[name].append(el)
        print(name, i, r["usage"]["prompt_tokens"], r["usage"]["prompt_tokens_details"], round(el, 2), flush=True)
for name in res: print(name, "median s", round(statistics.median(res[name]), 2))
print("after/before", round(statistics.median(a / b for a, b in zip(res["after"], res["before"])), 3))
for p, _ in servers.values(): p.terminate()
