"""Long prompts against running servers, A/B: each request's time to first token and total time, per server.

Two experiments, each run against every port in turn with the same requests (start the servers with the same flags,
e.g. an old and a new checkout of `specdec serve --draft-model qwen2.5-coder-0.5b`):

* ``neighbour`` — one long prompt (~3300 tokens of Spec-Bench summarization/rag documents), and 1.5 s later a short
  streamed request: how long the short one waits beside the long prompt's pass (chunked prefill; session 64);
* ``together`` — three long prompts (~``--tokens`` each) sent 0.2 s apart: each one's first token (first come, first
  served prompts; session 65).

    python benchmarks/long_prompts_served.py together --ports 18801,18802 --repeats 2 --tokens 1500
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request
from pathlib import Path

MODEL = "qwen2.5-coder-1.5b"
QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"


def documents() -> list[str]:
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    return [row["turns"][0] for row in rows if row["category"] in ("summarization", "rag")]


def streamed(port: int, body: dict) -> tuple[float, float]:
    """POST a streamed completion: (seconds to its first text, seconds to its end)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    start, first = time.time(), None
    with urllib.request.urlopen(request, timeout=900) as response:
        for line in response:
            text = line.decode().strip()
            if text.startswith("data:") and text[5:].strip() != "[DONE]":
                chunk = json.loads(text[5:])
                if chunk.get("choices") and chunk["choices"][0].get("text") and first is None:
                    first = time.time() - start
    return first if first is not None else float("nan"), time.time() - start


def count_tokens(port: int, text: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=json.dumps({"model": MODEL, "prompt": text}).encode(),
                                     headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request).read())["count"]


def wait_healthy(ports: list[int]) -> None:
    for port in ports:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health")
                break
            except OSError:
                time.sleep(2)


def long_prompt(port: int, docs: list[str], start: int, tokens: int) -> tuple[str, int]:
    """Documents from ``start`` joined until ``tokens`` long: the prompt and the next unused document."""
    parts: list[str] = []
    while start < len(docs):
        parts.append(docs[start])
        start += 1
        if count_tokens(port, "\n\n".join(parts)) >= tokens:
            break
    return "\n\n".join(parts), start


def run_concurrently(port: int, requests: list[tuple[dict, float]]) -> list[tuple[float, float]]:
    """Each (body, delay) sent after its delay, all at once: their (TTFT, total) in order."""
    results: list[tuple[float, float]] = [(0.0, 0.0)] * len(requests)

    def send(index: int, body: dict, delay: float) -> None:
        time.sleep(delay)
        results[index] = streamed(port, body)

    threads = [threading.Thread(target=send, args=(i, body, delay)) for i, (body, delay) in enumerate(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def neighbour(ports: list[int], repeats: int, tokens: int) -> None:
    docs = documents()
    for rep in range(repeats):
        prompt, _ = long_prompt(ports[0], docs, rep * 7, tokens)
        for port in ports:
            (long_ttft, long_total), (short_ttft, short_total) = run_concurrently(port, [
                ({"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True}, 0.0),
                ({"model": MODEL, "prompt": f"def reverse_{rep}(s):", "max_tokens": 16, "temperature": 0, "stream": True,
                  "ignore_eos": True}, 1.5)])
            print(f"rep {rep} port {port}: long ttft {long_ttft:.2f}s total {long_total:.2f}s | short ttft {short_ttft:.2f}s "
                  f"total {short_total:.2f}s", flush=True)


def together(ports: list[int], repeats: int, tokens: int) -> None:
    docs, start = documents(), 0
    for rep in range(repeats):
        prompts = []
        for index in range(3):
            text, start = long_prompt(ports[0], docs, start, tokens)
            prompts.append(f"Request {rep}.{index}\n\n{text}")
        for port in ports:
            results = run_concurrently(port, [({"model": MODEL, "prompt": p, "max_tokens": 8, "temperature": 0, "stream": True},
                                               0.2 * i) for i, p in enumerate(prompts)])
            print(f"rep {rep} port {port}: TTFT " + " / ".join(f"{ttft:.1f}" for ttft, _ in results) + " s (prompts "
                  + ", ".join(str(count_tokens(port, p)) for p in prompts) + " tokens)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", choices=("neighbour", "together"))
    parser.add_argument("--ports", required=True, help="comma-separated ports of servers started with the same flags")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=None, help="long prompt length (default: neighbour 3300, together 1500)")
    args = parser.parse_args()
    ports = [int(port) for port in args.ports.split(",")]
    wait_healthy(ports)
    experiment = neighbour if args.experiment == "neighbour" else together
    experiment(ports, args.repeats, args.tokens or (3300 if args.experiment == "neighbour" else 1500))


if __name__ == "__main__":
    main()
