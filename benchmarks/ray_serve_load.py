"""Total throughput of one `specdec serve` process against Ray Serve replicas on the same machine.

    .venv/bin/python benchmarks/ray_serve_load.py --requests 20 --max-tokens 32 --repeats 2

Configurations, started in turn (A B C A B C …) on the same port range, each answering the same
burst of N concurrent greedy requests (HumanEval prompts), speculation on (the server's drafter)
and off (``"speculative": null``) in the same server run:

- ``single``: `specdec serve` (one process, torch on every core)
- ``ray-1x{cores}``: `serve --ray --replicas 1 --ray-cpus-per-replica {cores}` (Ray's proxy in front)
- ``ray-{cores}x1``: `serve --ray --replicas {cores} --ray-cpus-per-replica 1`

Prints total tokens/s, p50 latency, errors, whether every answer equals the single process's, and
peak RSS of the server's process tree; writes a markdown table with the CPU flags.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import add_server_args  # noqa: E402

from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.cpu import cpu_description, cpu_flags  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_rss_gib(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants (Ray's replicas are grandchildren)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
            with open(f"/proc/{current}/task/{current}/children") as f:
                todo.extend(int(child) for child in f.read().split())
        except (OSError, StopIteration):
            continue
    return total / 2**20


def start(config: str, args: argparse.Namespace, cores: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    extra = {"single": [], f"ray-1x{cores}": ["--ray", "--replicas", "1", "--ray-cpus-per-replica", str(cores)],
             f"ray-{cores}x1": ["--ray", "--replicas", str(cores), "--ray-cpus-per-replica", "1"]}[config]
    command = [sys.executable, "-m", "specdec.cli", "serve", "--model", args.model, "--draft-model", args.draft_model,
               "--quantize", args.quantize, "--draft-quantize", args.draft_quantize, "--port", str(port),
               "--max-concurrency", str(args.requests), "--num-speculative-tokens", args.num_speculative_tokens, *extra]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    seen: set[str] = set()
    replicas = int(extra[extra.index("--replicas") + 1]) if extra else 1
    deadline = time.time() + 900
    while len(seen) < replicas:  # every replica up (the proxy answers as soon as one is)
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"{config}: the server did not start")
        try:
            seen.add(httpx.get(f"{base}/health", timeout=5).json()["instance"])
        except (httpx.HTTPError, ValueError, KeyError):
            time.sleep(1)
    return proc, base


def burst(base: str, prompts: list[str], max_tokens: int, speculative: bool) -> dict:
    def one(prompt: str) -> tuple[float, str | None, int]:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        if not speculative:
            body["speculative"] = None
        begin = time.perf_counter()
        try:
            response = httpx.post(f"{base}/v1/completions", json=body, timeout=900)
            response.raise_for_status()
            data = response.json()
            return time.perf_counter() - begin, data["choices"][0]["text"], data["usage"]["completion_tokens"]
        except httpx.HTTPError:
            return time.perf_counter() - begin, None, 0

    begin = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(one, prompts))
    wall = time.perf_counter() - begin
    return {"tok_s": sum(r[2] for r in results) / wall, "p50_s": statistics.median(r[0] for r in results),
            "errors": sum(r[1] is None for r in results), "texts": [r[1] for r in results]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_args(parser, gamma="4")
    parser.add_argument("--requests", type=int, default=20, help="concurrent requests per burst")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here too")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    configs = ["single", f"ray-1x{cores}", f"ray-{cores}x1"]
    prompts = [row.turns[0] for row in load_prompts("humaneval", limit=args.requests)]
    runs: dict[tuple[str, bool], list[dict]] = {}
    rss: dict[str, float] = {}
    for repeat in range(args.repeats):
        for config in configs:
            proc, base = start(config, args, cores)
            try:
                burst(base, prompts[:2], 4, True)  # warm-up
                for speculative in (True, False):
                    result = burst(base, prompts, args.max_tokens, speculative)
                    runs.setdefault((config, speculative), []).append(result)
                    print(f"repeat {repeat} {config:>10} speculation {'on ' if speculative else 'off'}: "
                          f"{result['tok_s']:.2f} tok/s, p50 {result['p50_s']:.1f} s, {result['errors']} errors", flush=True)
                rss[config] = max(rss.get(config, 0.0), tree_rss_gib(proc.pid))
            finally:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
    reference = {spec: runs[("single", spec)][0]["texts"] for spec in (True, False)}
    lines = [f"# Ray Serve replicas vs one process — {args.model} ← {args.draft_model} (γ {args.num_speculative_tokens}, "
             f"target {args.quantize}, draft {args.draft_quantize})", "",
             f"CPU: {cpu_description()}; flags: {' '.join(cpu_flags())}; {cores} cores. {args.requests} concurrent greedy "
             f"requests × {args.max_tokens} tokens (HumanEval prompts), loopback, median of {args.repeats} repeats "
             "(configurations interleaved).", "",
             "| configuration | speculation | total tok/s | vs single | p50 latency s | errors | answers equal single | peak RSS GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for speculative in (True, False):
        base_tok_s = statistics.median(r["tok_s"] for r in runs[("single", speculative)])
        for config in configs:
            results = runs[(config, speculative)]
            tok_s = statistics.median(r["tok_s"] for r in results)
            equal = all(r["texts"] == reference[speculative] for r in results)
            lines.append(f"| {config} | {'on' if speculative else 'off'} | {tok_s:.2f} | {tok_s / base_tok_s:.2f}× | "
                         f"{statistics.median(r['p50_s'] for r in results):.1f} | {sum(r['errors'] for r in results)} | "
                         f"{'yes' if equal else 'NO'} | {rss[config]:.1f} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table + "\n")
        (args.out.with_suffix(".json")).write_text(json.dumps(
            {f"{c}/{'on' if s else 'off'}": [{k: v for k, v in r.items() if k != "texts"} for r in rs]
             for (c, s), rs in runs.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
