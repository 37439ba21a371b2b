"""Closed-loop load on a real `specdec serve` over loopback: concurrency 1, 2, 4, 8, with and
without speculation, same server, same prompts, same run.

    .venv/bin/python benchmarks/serve_load.py --requests-per-level 8 --max-tokens 64

Each of C client threads sends streamed requests back to back until the level's requests are done;
prints requests/s, tokens/s, p50/p99 latency and median TTFT per (C, speculation). The server runs
with --disable-speculation-above (default 2), so under load speculation switches itself off.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdec.bench.datasets import load_prompts  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_request(base: str, prompt: str, max_tokens: int, speculative: bool) -> tuple[float, float, int]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
    if not speculative:
        body["speculative"] = None
    start = time.perf_counter()
    ttft = None
    tokens = 0
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if ttft is None:
                ttft = time.perf_counter() - start
            if "usage" in event:
                tokens = event["usage"]["completion_tokens"]
    return time.perf_counter() - start, ttft or 0.0, tokens


def run_level(base: str, prompts: list[str], concurrency: int, total: int, max_tokens: int, speculative: bool) -> dict:
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda i: one_request(base, prompts[i % len(prompts)], max_tokens, speculative), range(total)))
    wall = time.perf_counter() - start
    latencies = sorted(r[0] for r in results)
    return {"req_s": total / wall, "tok_s": sum(r[2] for r in results) / wall, "p50": statistics.median(latencies),
            "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], "ttft": statistics.median(r[1] for r in results)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--levels", default="1,2,4,8")
    parser.add_argument("--requests-per-level", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--disable-speculation-above", type=int, default=2)
    parser.add_argument("--num-speculative-tokens", default="4")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--model", args.model, "--draft-model", args.draft_model,
                               "--port", str(port), "--max-concurrency", str(max(levels)), "--num-speculative-tokens", args.num_speculative_tokens,
                               "--disable-speculation-above", str(args.disable_speculation_above)],
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
            if server.poll() is not None:
                raise SystemExit(server.stderr.read())
        prompts = [row.turns[0] for row in load_prompts("humaneval", limit=max(levels))]
        one_request(base, prompts[0], 8, True)  # warm-up
        print(f"# specdec serve, {args.model} ← {args.draft_model}, γ={args.num_speculative_tokens}, "
              f"--disable-speculation-above {args.disable_speculation_above}, {args.requests_per_level} requests per level, "
              f"{args.max_tokens} tokens each, greedy, HumanEval prompts, loopback")
        print("| concurrency | speculation | requests/s | tokens/s | p50 latency s | p99 latency s | median TTFT s |")
        print("|---|---|---|---|---|---|---|")
        for level in levels:
            for speculative in (False, True):
                r = run_level(base, prompts, level, args.requests_per_level, args.max_tokens, speculative)
                print(f"| {level} | {'on' if speculative else 'off'} | {r['req_s']:.2f} | {r['tok_s']:.2f} | {r['p50']:.2f} | "
                      f"{r['p99']:.2f} | {r['ttft']:.3f} |", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
