"""Closed-loop load on a real `specdec serve` over loopback: concurrency 1, 2, 4, 8, with and
without speculation, same server, same prompts, same run; with --compare-unbatched also a server
that runs one request per forward (as before continuous batching), levels interleaved.

    .venv/bin/python benchmarks/serve_load.py --compare-unbatched --requests-per-level 8 --max-tokens 32 --png load.png

Each of C client threads sends streamed requests back to back until the level's requests are done;
prints requests/s, total tokens/s, p50/p99 latency and median TTFT per (server, C, speculation).
Speculation is requested per request ("speculative": null turns it off); the servers' own
--disable-speculation-above is off by default here (1000) so both modes are measured at every C.
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
from specdec.cpu import cpu_description, cpu_flags  # noqa: E402


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


def start_server(args: argparse.Namespace, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    levels = [int(x) for x in args.levels.split(",")]
    server = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--model", args.model, "--draft-model", args.draft_model,
                               "--quantize", args.quantize, "--draft-quantize", args.draft_quantize, "--port", str(port), "--max-concurrency", str(max(levels)),
                               "--num-speculative-tokens", args.num_speculative_tokens,
                               "--disable-speculation-above", str(args.disable_speculation_above), *extra],
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    for _ in range(900):
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return server, base
        except httpx.HTTPError:
            time.sleep(1)
        if server.poll() is not None:
            raise SystemExit(server.stderr.read())
    raise SystemExit("the server did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--quantize", default="int8", help="target mode (fixed, so both servers run the same kernels)")
    parser.add_argument("--levels", default="1,2,4,8")
    parser.add_argument("--requests-per-level", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--draft-quantize", default="int4-all")
    parser.add_argument("--disable-speculation-above", default="1000", help="the servers' policy (a number, auto or never)")
    parser.add_argument("--num-speculative-tokens", default="4")
    parser.add_argument("--compare-unbatched", action="store_true",
                        help="also run a server with --max-num-batched-tokens 1 (one request per forward, as before "
                             "continuous batching), the levels interleaved between the two")
    parser.add_argument("--png", type=Path, default=None, help="write total tokens/s per concurrency here")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    configs = {"batched": []}
    if args.compare_unbatched:
        configs["one-by-one"] = ["--max-num-batched-tokens", "1"]
    servers = {name: start_server(args, extra) for name, extra in configs.items()}
    rows: dict[tuple[str, bool], dict[int, float]] = {}
    try:
        prompts = [row.turns[0] for row in load_prompts("humaneval", limit=max(levels))]
        for _, base in servers.values():
            one_request(base, prompts[0], 8, True)  # warm-up
        print(f"# specdec serve, {args.model} ({args.quantize}) <- {args.draft_model} ({args.draft_quantize}), γ={args.num_speculative_tokens}, "
              f"--disable-speculation-above {args.disable_speculation_above}, {args.requests_per_level} requests per level, "
              f"{args.max_tokens} tokens each, greedy, HumanEval prompts, loopback; CPU {cpu_description()} ({' '.join(cpu_flags())})")
        print("| server | concurrency | speculation | requests/s | tokens/s | p50 latency s | p99 latency s | median TTFT s |")
        print("|---|---|---|---|---|---|---|---|")
        for level in levels:
            for speculative in (False, True):
                for name, (_, base) in servers.items():
                    r = run_level(base, prompts, level, args.requests_per_level, args.max_tokens, speculative)
                    rows.setdefault((name, speculative), {})[level] = r["tok_s"]
                    print(f"| {name} | {level} | {'on' if speculative else 'off'} | {r['req_s']:.2f} | {r['tok_s']:.2f} | "
                          f"{r['p50']:.2f} | {r['p99']:.2f} | {r['ttft']:.3f} |", flush=True)
    finally:
        for server, _ in servers.values():
            server.terminate()
            server.wait(timeout=30)
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for (name, speculative), points in rows.items():
            ax.plot(list(points), list(points.values()), marker="o", label=f"{name}, speculation {'on' if speculative else 'off'}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("total tokens/s")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
