"""Replay the suffix drafter against known greedy outputs (no target forwards): τ of chains vs trees.

Greedy output is fixed, so a round's accepted length is the longest draft path matching the output.
Data: train-drafter's self-distilled continuations (target greedy over stdlib prompts), JSONL with
tokens (prompt + continuation) and prompt_tokens. The first H records fill the shared table; the
next N are measured, each entering the table after it is measured (a server's history)."""

from __future__ import annotations

import json
import statistics
import sys

sys.path.insert(0, "/work/main"); sys.path.insert(0, __import__("os").path.dirname(__file__))

from specdec.drafters.suffix import GlobalSuffixCache, SuffixDrafter  # noqa: E402
from specdec.tree import children  # noqa: E402


def replay(drafter: SuffixDrafter, prompt: list[int], output: list[int], gamma: int) -> tuple[float, float]:
    drafter.start(prompt)
    position, rounds, verified = 0, 0, 0
    while position < len(output):
        context = prompt + output[:position]
        draft = drafter.propose(context, gamma)
        truth = output[position:]
        rounds += 1
        verified += len(draft.tokens)
        if draft.parents is None:
            accepted = 0
            while accepted < len(draft.tokens) and accepted < len(truth) and draft.tokens[accepted] == truth[accepted]:
                accepted += 1
            nxt = truth[accepted] if accepted < len(truth) else -1
            drafter.accepted(accepted, nxt)
        else:
            kids = children(draft.parents)
            path: list[int] = []
            parent = -1
            while len(path) < len(truth):
                match = [c for c in kids.get(parent, []) if draft.tokens[c] == truth[len(path)]]
                if not match:
                    break
                path.append(match[0])
                parent = match[0]
            accepted = len(path)
            nxt = truth[accepted] if accepted < len(truth) else -1
            drafter.accepted_path(path, nxt)
        position += accepted + 1
    drafter.finish()
    return position / rounds, verified / rounds


def main() -> None:
    path, history, measured, gamma = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    records = [json.loads(line) for line in open(path)]
    records = [r for r in records if len(r["tokens"]) > r["prompt_tokens"] + 8]
    mc = float(sys.argv[5]) if len(sys.argv) > 5 else 0.1
    from backoff import Backoff
    configs = {"chain": (0, 0.1, SuffixDrafter), f"chain mc={mc}": (0, mc, SuffixDrafter), f"tree={gamma}": (gamma, 0.1, SuffixDrafter), f"tree={gamma} mc={mc}": (gamma, mc, SuffixDrafter),
               f"backoff tree={gamma}": (gamma, 0.1, Backoff), f"backoff tree={gamma} mc={mc}": (gamma, mc, Backoff)}
    class B3(Backoff): levels = 3
    class B2(Backoff): levels = 2
    configs = {k: v for k, v in configs.items() if "mc" not in k}
    configs.update({"b3 tree": (gamma, 0.1, B3), "b2 tree": (gamma, 0.1, B2)})
    results = {name: ([], []) for name in configs}
    for name, (nodes, conf, cls) in configs.items():
        cache = GlobalSuffixCache()
        for r in records[:history]:
            cache.add_request(r["tokens"][max(0, r["prompt_tokens"] - 8):])
        for r in records[history : history + measured]:
            drafter = cls(cache=cache, tree_nodes=nodes, min_confidence=conf)
            tau, ver = replay(drafter, r["tokens"][: r["prompt_tokens"]], r["tokens"][r["prompt_tokens"]:], gamma)
            results[name][0].append(tau)
            results[name][1].append(ver)
    chain = results["chain"][0]
    for name, (taus, vers) in results.items():
        ratios = [a / b for a, b in zip(taus, chain)]
        print(f"{name:10s} τ median {statistics.median(taus):.3f} mean {statistics.mean(taus):.3f} "
              f"× chain median {statistics.median(ratios):.3f} mean {statistics.mean(ratios):.3f} "
              f"verified/round {statistics.mean(vers):.2f}")


if __name__ == "__main__":
    main()
