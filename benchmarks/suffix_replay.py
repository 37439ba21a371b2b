"""Suffix decoding's τ by replay: its chains and trees against the target's known greedy outputs, no
model forwards — seconds per configuration instead of minutes, for trying a table drafter's rules.

    .venv/bin/python benchmarks/suffix_replay.py --outputs /tmp/plain-outputs.json --gamma 8

Under greedy decoding the target's output does not depend on the drafts (that is the product), so a
round's outcome is known in advance: the target accepts the longest drafted path matching its own
next tokens, then commits one more. The replay drives :class:`specdec.drafters.suffix.SuffixDrafter`
through the engine's lifecycle (start → propose → accepted / accepted_path → finish) on those outputs
and counts rounds, as ``tree_vs_chain.py --costs flat`` does with real forwards (every proposed node
verified). The shared suffix table of each measured prompt holds ``--history`` other prompts' outputs
of its group and the measured prompts' before it — never its own.

``--outputs FILE``: the greedy outputs (JSON: group → [{"id", "prompt", "output"}]); made with the
int8 target through ``generate_batch`` when the file does not exist. ``--backoff`` also replays trees
whose nodes take siblings from shorter matching contexts (tried in session 28, not adopted).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdec.drafters.suffix import GlobalSuffixCache, SuffixDrafter  # noqa: E402
from specdec.tree import children  # noqa: E402

GROUPS = {"humaneval": ("humaneval", None), "mt_bench": ("spec_bench", ["mt_bench"]), "gsm8k": ("gsm8k", None),
          "summarization": ("spec_bench", ["summarization"])}
#: a finished request enters the shared table with its prompt's last tokens as context (SuffixDrafter.finish)
PROMPT_CONTEXT = 8


class BackoffSuffixDrafter(SuffixDrafter):
    """Tree nodes' siblings also from shorter matching contexts: each shorter context's continuations
    not yet listed, weighted by their share, the acceptance rate of matches that long, and the
    probability the longer contexts' candidates left."""

    def _predict(self, tokens: list[int], choices: int = 1):  # noqa: ANN202 - as the base class's
        if choices == 1:
            return super()._predict(tokens, choices)
        candidates: dict[int, float] = {}
        longest, left = None, 1.0
        for depth in range(min(self.local.max_depth, len(tokens)), 0, -1):
            merged: dict[int, int] = {}
            for table in (self.local, self.cache.table):
                for token, count in (table.table.get(tuple(tokens[-depth:])) or {}).items():
                    merged[token] = merged.get(token, 0) + count
            if not merged:
                continue
            longest = longest or depth
            total = sum(merged.values())
            rate = self.match_accepts[self._bucket(depth)] / self.match_trials[self._bucket(depth)]
            used = 0.0
            for token, count in sorted(merged.items(), key=lambda item: -item[1])[:choices]:
                if token not in candidates:
                    candidates[token] = left * rate * count / total
                    used += candidates[token]
            left = max(0.0, left - used)
        if not candidates:
            return None
        return sorted(candidates.items(), key=lambda item: -item[1])[:choices], longest


def replay(drafter: SuffixDrafter, prompt: list[int], output: list[int], gamma: int) -> dict[str, float]:
    """τ (tokens per round), nodes proposed per round and the rounds a non-first branch won."""
    drafter.start(prompt)
    committed, position, rounds, nodes, branch_wins = list(prompt) + [output[0]], 1, 0, 0, 0
    while position < len(output):
        draft = drafter.propose(committed, gamma)
        rounds += 1
        nodes += len(draft.tokens)
        path: list[int] = []
        if draft.parents is None:
            while (len(path) < len(draft.tokens) and position + len(path) < len(output)
                   and draft.tokens[len(path)] == output[position + len(path)]):
                path.append(len(path))
        else:
            kids, parent = children(draft.parents), -1
            while position + len(path) < len(output):
                match = [c for c in kids.get(parent, []) if draft.tokens[c] == output[position + len(path)]]
                if not match:
                    break
                path.append(match[0])
                parent = match[0]
            branch_wins += any(kids[p][0] != node for p, node in zip([-1, *path], path))
        end = position + len(path)
        if end >= len(output):
            break
        if draft.parents is None:
            drafter.accepted(len(path), output[end])
        else:
            drafter.accepted_path(path, output[end])
        committed += output[position : end + 1]
        position = end + 1
    drafter.finish()
    return {"tau": (position - 1) / max(rounds, 1), "nodes": nodes / max(rounds, 1), "wins": branch_wins / max(rounds, 1)}


def make_outputs(path: Path, groups: list[str], count: int, max_tokens: int) -> None:
    """The int8 target's greedy outputs for the first ``count`` prompts of each group (batched)."""
    from specdec.api import encode_prompt, load_model
    from specdec.batch import generate_batch
    from specdec.bench.datasets import load_prompts
    from specdec.sampling import SamplingParams

    target = load_model("qwen2.5-coder-1.5b", quantize="int8")
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    result = {}
    for group in groups:
        rows = load_prompts(*GROUPS[group])[:count]
        prompts = [encode_prompt(target, row.turns[0], chat=row.chat) for row in rows]
        outputs = generate_batch(target, prompts, params, max_num_seqs=8, progress=True)
        result[group] = [{"id": row.id, "prompt": p, "output": o.token_ids} for row, p, o in zip(rows, prompts, outputs)]
    path.write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outputs", type=Path, required=True, help="greedy outputs (JSON), made if missing")
    parser.add_argument("--groups", default="humaneval,mt_bench,gsm8k,summarization")
    parser.add_argument("--limit", type=int, default=6, help="measured prompts per group")
    parser.add_argument("--history", type=int, default=12, help="other prompts' outputs in the shared table")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens of each output replayed")
    parser.add_argument("--gamma", type=int, default=8, help="chain length and tree node budget")
    parser.add_argument("--backoff", action="store_true", help="also trees with siblings from shorter contexts")
    parser.add_argument("--min-confidence", type=float, default=SuffixDrafter(tree_nodes=0).min_confidence,
                        help="the drafter's floor on a path's estimated acceptance (default: the drafter's own)")
    args = parser.parse_args()
    groups = args.groups.split(",")
    if not args.outputs.is_file():
        make_outputs(args.outputs, groups, args.limit + args.history, args.max_tokens)
    data = json.loads(args.outputs.read_text())
    configs = {"chain": (SuffixDrafter, 0), f"tree={args.gamma}": (SuffixDrafter, args.gamma)}
    if args.backoff:
        configs[f"back-off tree={args.gamma}"] = (BackoffSuffixDrafter, args.gamma)
    print(f"# suffix decoding replayed on greedy outputs ({args.outputs.name}): {args.limit} prompts per group, "
          f"{args.max_tokens} tokens, γ={args.gamma}, floor {args.min_confidence}, shared table: {args.history} other prompts' outputs + the "
          f"measured ones before\n")
    print("| group | config | τ | τ × chain | nodes/round | branch wins |\n|---|---|---|---|---|---|")
    for group in groups:
        rows = data[group]
        measured, history = rows[: args.limit], rows[args.limit : args.limit + args.history]
        results: dict[str, list[dict[str, float]]] = {}
        for name, (kind, tree_nodes) in configs.items():
            for j, row in enumerate(measured):
                cache = GlobalSuffixCache()
                for seen in history + measured[:j]:
                    cache.add_request(seen["prompt"][-PROMPT_CONTEXT:] + seen["output"][: args.max_tokens])
                drafter = kind(cache=cache, tree_nodes=tree_nodes, min_confidence=args.min_confidence)
                results.setdefault(name, []).append(replay(drafter, row["prompt"], row["output"][: args.max_tokens], args.gamma))
        for name, values in results.items():
            ratio = statistics.median(v["tau"] / c["tau"] for v, c in zip(values, results["chain"]))
            print(f"| {group} | {name} | {statistics.median(v['tau'] for v in values):.2f} | {ratio:.2f} | "
                  f"{statistics.median(v['nodes'] for v in values):.1f} | {statistics.median(v['wins'] for v in values):.0%} |")


if __name__ == "__main__":
    main()
