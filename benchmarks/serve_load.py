"""Closed-loop load on a real `specdec serve` over loopback: concurrency 1, 2, 4, 8 (…32), with and
without speculation, same server, same prompts, same run; with --compare-unbatched also a server
that runs one request per forward (as before continuous batching), levels interleaved.

    .venv/bin/python benchmarks/serve_load.py --compare-unbatched --requests-per-level 8 --max-tokens 32 --png load.png
    .venv/bin/python benchmarks/serve_load.py --dataset mt_bench --levels 1,2,4,8,16,32 --burst 200 --png load.png

Each of C client threads sends streamed requests back to back until the level's requests are done
(``--arrivals staggered``: the clients start spread over one request's latency alone, so prompts do
not all arrive in the same instant — the steady stream a TTFT goal is about);
prints requests/s, total tokens/s (and its ratio to one request's, same speculation), p50/p99
latency, median TTFT, draft tokens proposed (and accepted) per request, the server's resident
memory, errors, and how many greedy outputs differ from the same prompt's answer on the first
server (--compare-unbatched or --variant: each pass sends the same prompts to every server, and
they must not differ: batched forwards are bit-identical to a request's own, speculation and prefix
caching are exact).
Each level sends prompts no earlier level sent, the same ones with speculation off and on, and every
pass starts with the server's prefix and suffix caches emptied (POST /reset_prefix_cache,
/reset_suffix_cache): a prompt answered before would be drafted from its own earlier output — a
near-perfect draft no real request gets (measured: draft_suffix at 8 concurrent MT-Bench requests
1.27x speculation off with repeated prompts) — and start from its own cached prompt (TTFT 0.12 s
instead of 0.46 s at level 1); and two passes over different prompts are not comparable (16 MT-Bench
prompts' rows differed up to 2x between sets: speculation "on" read 0.82x "off" at 8 concurrent with
nothing drafted). The outputs with speculation on are then checked against the same prompts' without.
MT-Bench's second turns serve as prompts of their own once the first turns are used; where the
dataset runs out, prompts repeat and the header says so.
``--burst N`` then fires N requests at once (queueing beyond --max-num-seqs).
Speculation is requested per request ("speculative": null turns it off); the servers' own
--disable-speculation-above is off by default here (1000) so both modes are measured at every C.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.cpu import cpu_description, cpu_flags  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Result:
    latency: float
    ttft: float
    tokens: int
    text: str | None  # None: the request failed
    cached: int = 0  # prompt tokens the server's prefix cache held (usage.prompt_tokens_details)


def one_request(base: str, prompt: str | list[dict], max_tokens: int, speculative: bool, chat: bool) -> Result:
    """One streamed greedy request; ``prompt``: text, or a conversation's messages (chat)."""
    body: dict = {"max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    body.update({"messages": messages} if chat else {"prompt": prompt})
    if not speculative:
        body["speculative"] = None
    start = time.perf_counter()
    ttft, tokens, pieces, cached = None, 0, [], 0
    try:
        with httpx.stream("POST", f"{base}/v1/{'chat/completions' if chat else 'completions'}", json=body, timeout=1200) as response:
            if response.status_code != 200:
                return Result(time.perf_counter() - start, 0.0, 0, None)
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                choice = event["choices"][0]
                piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    pieces.append(piece)
                if "usage" in event:
                    tokens = event["usage"]["completion_tokens"]
                    cached = event["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    except httpx.HTTPError:
        return Result(time.perf_counter() - start, 0.0, 0, None)
    return Result(time.perf_counter() - start, ttft or 0.0, tokens, "".join(pieces), cached)


def drafted_tokens(base: str) -> tuple[float, float]:
    """(draft tokens proposed, accepted) so far, all methods, from the server's /metrics."""
    totals = {"draft": 0.0, "accepted": 0.0}
    for line in httpx.get(f"{base}/metrics", timeout=60).text.splitlines():
        for kind in totals:
            if line.startswith(f"specdec_spec_decode_num_{kind}_tokens_total{{"):
                totals[kind] += float(line.rsplit(" ", 1)[1])
    return totals["draft"], totals["accepted"]


def server_memory_mb(server: subprocess.Popen) -> tuple[float, float]:
    """The server process's resident memory now and at its peak (VmRSS, VmHWM), in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{server.pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def run_level(base: str, prompts: list[str], concurrency: int, total: int, max_tokens: int, speculative: bool,
              chat: bool, alone: dict[int, str], stagger_s: float = 0.0, indices: list[int] | None = None) -> dict:
    """Requests for the prompts at ``indices`` (``total`` of them; None: 0, 1, …, wrapping around before
    the last prompt, the warm-up's). ``alone``: prompt index → its first greedy answer (filled as it goes).
    ``stagger_s``: client k sends its first request k × ``stagger_s`` seconds after the level starts
    (0: all at once), so arrivals spread over a request's lifetime as in a steady stream of users,
    instead of every client's prompt arriving in the same instant."""
    start = time.perf_counter()

    def prompt_index(i: int) -> int:  # request i's prompt (the last one is the warm-up's)
        return indices[i] if indices is not None else i % (len(prompts) - 1)

    def client(k: int) -> list[Result]:
        time.sleep(k * stagger_s)
        return [one_request(base, prompts[prompt_index(i)], max_tokens, speculative, chat)
                for i in range(k, total, concurrency)]

    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        per_client = list(pool.map(client, range(concurrency)))
    results = [None] * total
    for k, done_by_client in enumerate(per_client):
        for j, result in enumerate(done_by_client):
            results[k + j * concurrency] = result
    wall = time.perf_counter() - start
    done = [r for r in results if r.text is not None]
    differ = 0
    for i, r in enumerate(results):
        if r.text is not None:
            expected = alone.setdefault(prompt_index(i), r.text)
            differ += r.text != expected
    latencies = sorted(r.latency for r in done) or [0.0]
    return {"req_s": len(done) / wall, "tok_s": sum(r.tokens for r in done) / wall, "p50": statistics.median(latencies),
            "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "ttft": statistics.median(r.ttft for r in done) if done else 0.0, "errors": len(results) - len(done), "differ": differ}


def reset_caches(base: str) -> None:
    """Empty the server's prefix and suffix caches (a 400 from the first: prefix caching is off)."""
    for route in ("reset_prefix_cache", "reset_suffix_cache"):
        response = httpx.post(f"{base}/{route}", timeout=60)
        if response.status_code != 200 and not (route == "reset_prefix_cache" and response.status_code == 400):
            raise RuntimeError(f"POST /{route}: HTTP {response.status_code} {response.text}")


def deal_prompts(pool: int, counts: list[int]) -> list[list[int]]:
    """Prompt indices for each level (``counts[p]`` of them out of ``pool``), spread so that every level
    draws evenly from the whole range used (HumanEval's later prompts are longer: consecutive blocks
    gave passes ~45 % more prompt rows than others). Wraps around where the pool is smaller than the
    levels need."""
    # every level's j-th request sits at (j + 0.5) / count of the way through: hand out indices in that order
    slots = sorted(((j + 0.5) / count, p) for p, count in enumerate(counts) for j in range(count))
    dealt: list[list[int]] = [[] for _ in counts]
    for next_index, (_, p) in enumerate(slots):
        dealt[p].append(next_index % pool)
    return dealt


def parse_variant(variant: str) -> tuple[str, dict[str, str], list[str]]:
    """``--variant`` ``NAME=[KEY=VALUE …] [--flag …]`` → (name, the server's extra environment, its extra
    flags). Raises SystemExit naming the variant when a word before the first flag is not KEY=VALUE."""
    name, _, rest = variant.partition("=")
    words = shlex.split(rest)
    settings = words[:next((i for i, w in enumerate(words) if w.startswith("-")), len(words))]
    if not name or any("=" not in w for w in settings):
        raise SystemExit(f"--variant {variant!r}: NAME=, then KEY=VALUE settings, then `specdec serve` flags")
    return name, dict(w.split("=", 1) for w in settings), words[len(settings):]


def stop_servers(servers: dict[str, tuple[subprocess.Popen, str]]) -> None:
    for server, _ in servers.values():
        server.terminate()
        server.wait(timeout=30)


def add_server_args(parser: argparse.ArgumentParser, gamma: str) -> None:
    """The flags every load benchmark passes to its `specdec serve` (``gamma``: the default γ)."""
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--quantize", default="int8", help="target mode (fixed, so every server runs the same kernels)")
    parser.add_argument("--draft-quantize", default="int4-all")
    parser.add_argument("--num-speculative-tokens", default=gamma)


def start_server(args: argparse.Namespace, extra: list[str], max_concurrency: int = 1,
                 max_queue: int = 64, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """`specdec serve` of :func:`add_server_args`'s models with ``extra`` flags (and ``env`` added to
    its environment), once healthy."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--model", args.model, "--draft-model", args.draft_model,
                               "--quantize", args.quantize, "--draft-quantize", args.draft_quantize, "--port", str(port),
                               "--max-concurrency", str(max_concurrency), "--max-queue", str(max_queue),
                               "--num-speculative-tokens", args.num_speculative_tokens, *extra],
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
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
    add_server_args(parser, gamma="4")
    parser.add_argument("--levels", default="1,2,4,8")
    parser.add_argument("--requests-per-level", type=int, default=8, help="requests per level (at least the level's concurrency)")
    parser.add_argument("--waves", type=int, default=1,
                        help="at least this many requests per client at every level (a level of C sends max(requests "
                             "per level, waves x C)): with one wave a high level is mostly ramp-up and tail, not the "
                             "steady load its throughput stands for")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--disable-speculation-above", default="1000", help="the servers' policy (a number, auto or never)")
    parser.add_argument("--compare-unbatched", action="store_true",
                        help="also run a server with --max-num-batched-tokens 1 (one request per forward, as before "
                             "continuous batching), the levels interleaved between the two")
    parser.add_argument("--dataset", default="humaneval", choices=["humaneval", "mt_bench", "gsm8k"],
                        help="prompts: HumanEval as raw completions (long code prompts), MT-Bench first turns or GSM8K "
                             "questions as chat messages (short)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="also start a server with these extra `specdec serve` flags (e.g. \"budget256=--max-num-batched-tokens "
                             "256\"), measured level by level beside the default one; leading KEY=VALUE words set its "
                             "environment (\"fbgemm=SPECDEC_INT8_KERNEL=fbgemm\"); repeatable")
    parser.add_argument("--arrivals", choices=["together", "staggered"], default="together",
                        help="together: every client sends its first request at once (a burst of C prompts per level); "
                             "staggered: client k starts k/C of one request's latency alone (speculation off, for both modes) "
                             "later (steady arrivals)")
    parser.add_argument("--burst", type=int, default=0, help="after the levels, fire this many requests at once (0: skip)")
    parser.add_argument("--png", type=Path, default=None, help="write total tokens/s per concurrency here")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    configs: dict[str, list[str]] = {"batched": []}
    environments: dict[str, dict[str, str]] = {}
    if args.compare_unbatched:
        configs["one-by-one"] = ["--max-num-batched-tokens", "1"]
    for variant in args.variant:
        name, environment, flags = parse_variant(variant)
        environments[name], configs[name] = environment, flags
    policy = ["--disable-speculation-above", str(args.disable_speculation_above)]
    servers = {name: start_server(args, policy + extra, max(levels), max(args.burst, 64), environments.get(name))
               for name, extra in configs.items()}
    rows: dict[tuple[str, bool], dict[int, float]] = {}
    chat = args.dataset != "humaneval"
    alone: dict[int, str] = {}
    # the first level's p50 latency per server without speculation: both modes' clients arrive on that
    # schedule (the users do not arrive faster because the server speculates)
    alone_latency: dict[str, float] = {}
    try:
        if args.dataset == "mt_bench":
            rows_ = load_prompts("spec_bench", categories=["mt_bench"], limit=None)
        else:
            rows_ = load_prompts(args.dataset)
        # first turns, then (MT-Bench) the second turns as prompts of their own where more are needed
        prompts = [row.turns[0] for row in rows_] + [turn for row in rows_ for turn in row.turns[1:]]
        # each level its own prompts, both modes the same (see the module docstring); the warm-up gets
        # one no pass sends
        counts = [max(args.waves * level, args.requests_per_level) for level in levels]
        needed = sum(counts)
        repeats = needed + 1 > len(prompts)
        dealt = deal_prompts(len(prompts) - 1, counts)
        passes = [((level, speculative), indices) for level, indices in zip(levels, dealt) for speculative in (False, True)]
        for _, base in servers.values():
            one_request(base, prompts[-1], 8, True, chat)  # warm-up
        print(f"# specdec serve, {args.model} ({args.quantize}) <- {args.draft_model} ({args.draft_quantize}), γ={args.num_speculative_tokens}, "
              f"--disable-speculation-above {args.disable_speculation_above}, {args.requests_per_level} requests per level (at least {args.waves} per client), "
              f"{args.max_tokens} tokens each, greedy, {min(needed, len(prompts) - 1)} {args.dataset} prompts"
              f"{' (chat)' if chat else ''}{', REPEATED across levels (too few)' if repeats else ', new ones for each level, the same for both modes'}, "
              f"arrivals {args.arrivals}, loopback; "
              f"CPU {cpu_description()} ({' '.join(cpu_flags())})")
        print("| server | concurrency | speculation | requests/s | tokens/s | × one request | p50 latency s | p99 latency s "
              "| median TTFT s | drafted (accepted) per request | RSS MB (peak) | errors | outputs ≠ first server's |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for (level, speculative), indices in passes:  # every server, the same prompts
            for name, (server, base) in servers.items():
                reset_caches(base)
                drafted_before, accepted_before = drafted_tokens(base)
                stagger = 0.0
                if args.arrivals == "staggered" and name in alone_latency:
                    stagger = alone_latency[name] / level
                r = run_level(base, prompts, level, len(indices), args.max_tokens, speculative,
                              chat, alone, stagger, indices)
                alone_latency.setdefault(name, r["p50"])
                points = rows.setdefault((name, speculative), {})
                points[level] = r["tok_s"]
                rss, peak = server_memory_mb(server)
                drafted, accepted = (now - before for now, before in zip(drafted_tokens(base), (drafted_before, accepted_before)))
                print(f"| {name} | {level} | {'on' if speculative else 'off'} | {r['req_s']:.2f} | {r['tok_s']:.2f} | "
                      f"{r['tok_s'] / points[min(points)]:.2f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['ttft']:.3f} | "
                      f"{drafted / len(indices):.1f} ({accepted / len(indices):.1f}) | "
                      f"{rss:.0f} ({peak:.0f}) | {r['errors']} | {r['differ']} |", flush=True)
        if args.burst:
            for name, (server, base) in servers.items():
                r = run_level(base, prompts, args.burst, args.burst, args.max_tokens, True, chat, alone)
                rss, peak = server_memory_mb(server)
                print(f"\nburst on {name}: {args.burst} requests at once (speculation requested): {r['tok_s']:.2f} tokens/s, "
                      f"p50 latency {r['p50']:.1f} s, p99 {r['p99']:.1f} s, RSS {rss:.0f} MB (peak {peak:.0f}), "
                      f"errors {r['errors']}, outputs ≠ alone {r['differ']}", flush=True)
    finally:
        stop_servers(servers)
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
