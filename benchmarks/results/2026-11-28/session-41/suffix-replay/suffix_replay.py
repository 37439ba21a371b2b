"""Replay the suffix drafter against train-drafter's self-distilled continuations (the target's greedy
output over stdlib prompts; no forwards): τ of chains vs trees, with ``benchmarks/suffix_replay.py``'s
replay. The first HISTORY records fill the shared table; the next MEASURED are measured, each entering
the table after it (a server's history). Every configuration drafts with MIN_CONFIDENCE.

    python suffix_replay.py OUT/generated.jsonl HISTORY MEASURED GAMMA [MIN_CONFIDENCE]"""

import statistics
import sys
from pathlib import Path

from backoff import Backoff, read_continuations, table_of

sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "benchmarks"))
from suffix_replay import replay  # noqa: E402  (benchmarks/suffix_replay.py, not this file)

from specdec.drafters.suffix import SuffixDrafter  # noqa: E402


class TwoLevels(Backoff):
    levels = 2


def main() -> None:
    path, history, measured, gamma = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    confidence = float(sys.argv[5]) if len(sys.argv) > 5 else 0.1
    records = read_continuations(path)
    configs = {"chain": (0, SuffixDrafter), f"tree={gamma}": (gamma, SuffixDrafter),
               f"tree={gamma} backoff": (gamma, Backoff), f"tree={gamma} backoff 2": (gamma, TwoLevels)}
    results = {}
    for name, (nodes, kind) in configs.items():
        cache = table_of(records[:history])
        results[name] = [replay(kind(cache=cache, tree_nodes=nodes, min_confidence=confidence),
                                r["tokens"][: r["prompt_tokens"]], r["tokens"][r["prompt_tokens"]:], gamma)
                         for r in records[history : history + measured]]
    chain = [run["tau"] for run in results["chain"]]
    print(f"# {measured} measured, {history} in the table, γ={gamma}, min_confidence {confidence}")
    for name, runs in results.items():
        taus = [run["tau"] for run in runs]
        print(f"{name:20s} τ median {statistics.median(taus):.3f} × chain median "
              f"{statistics.median(a / b for a, b in zip(taus, chain)):.3f} "
              f"nodes/round {statistics.mean(run['nodes'] for run in runs):.2f}")


if __name__ == "__main__":
    main()
