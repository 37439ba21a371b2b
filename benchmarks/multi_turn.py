"""Multi-turn chat on a real `specdec serve`: what the prefix cache saves when a client re-sends the
conversation with each new message (as every chat client does).

    .venv/bin/python benchmarks/multi_turn.py --conversations 8 --max-tokens 64

Two servers of the same models, prefix caching on (the default on int8/int4) and off
(``--no-enable-prefix-caching``); each MT-Bench conversation (two user turns) runs on both, servers
interleaved per conversation: turn 1, then turn 2 with turn 1's answer in the history. Prints per
server and turn the medians of cached prompt tokens (usage.prompt_tokens_details),
TTFT and latency, and TTFT's ratio to the cache-off server (per conversation, then the median); the
answers of the two servers must be identical (greedy; restored keys/values are the bits a prompt
pass computes). Turn 1's prompts share only the chat template's system turn.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import add_server_args, one_request, server_memory_mb, start_server, stop_servers  # noqa: E402

from specdec.bench.datasets import load_prompts  # noqa: E402
from specdec.cpu import cpu_description  # noqa: E402

POLICY = ["--disable-speculation-above", "never"]  # one request at a time: the load policy never acts
SERVERS = {"prefix cache on": POLICY, "prefix cache off": [*POLICY, "--no-enable-prefix-caching"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_args(parser, gamma="auto")
    parser.add_argument("--conversations", type=int, default=8, help="MT-Bench conversations (two turns each)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per answer")
    parser.add_argument("--speculation", choices=("on", "off"), default="on", help="requests ask for speculation")
    args = parser.parse_args()
    rows = [row for row in load_prompts("spec_bench", categories=["mt_bench"], limit=None) if len(row.turns) >= 2]
    rows = rows[: args.conversations]
    servers = {name: start_server(args, extra) for name, extra in SERVERS.items()}
    speculative = args.speculation == "on"
    results: dict[tuple[str, int], list] = {}
    try:
        for _, base in servers.values():  # warm-up: one short request each (the same for both)
            one_request(base, "Say hello.", 4, speculative, True)
        print(f"# specdec serve, {args.model} ({args.quantize}) <- {args.draft_model} ({args.draft_quantize}), "
              f"γ={args.num_speculative_tokens}, speculation {args.speculation}, {len(rows)} MT-Bench conversations × 2 turns, "
              f"{args.max_tokens} tokens per answer, greedy, one conversation at a time; CPU {cpu_description()}", flush=True)
        for row in rows:
            for name, (_, base) in servers.items():
                messages = [{"role": "user", "content": row.turns[0]}]
                first = one_request(base, messages, args.max_tokens, speculative, True)
                messages += [{"role": "assistant", "content": first.text or ""}, {"role": "user", "content": row.turns[1]}]
                second = one_request(base, messages, args.max_tokens, speculative, True)
                results.setdefault((name, 1), []).append(first)
                results.setdefault((name, 2), []).append(second)
            print(f"  conversation {row.id}: done", flush=True)
        print("\n| server | turn | cached prompt tokens | TTFT s | TTFT × cache off | latency s | RSS MB (peak) | errors | answers ≠ cache off |")
        print("|---|---|---|---|---|---|---|---|---|")
        for (name, turn), done in results.items():
            off = results[("prefix cache off", turn)]
            ratios = [a.ttft / b.ttft for a, b in zip(done, off) if a.ttft and b.ttft]
            differ = sum(a.text != b.text for a, b in zip(done, off))
            errors = sum(r.text is None for r in done)
            rss, peak = server_memory_mb(servers[name][0])
            print(f"| {name} | {turn} | {statistics.median(r.cached for r in done):.0f} | "
                  f"{statistics.median(r.ttft for r in done):.3f} | {statistics.median(ratios):.2f} | "
                  f"{statistics.median(r.latency for r in done):.2f} | {rss:.0f} ({peak:.0f}) | {errors} | {differ} |", flush=True)
    finally:
        stop_servers(servers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
