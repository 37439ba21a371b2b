"""Write long-context prompts (a JSONL for `--groups FILE` / `specdec bench --dataset FILE`): each joins whole
Spec-Bench summarization tasks (CNN/DailyMail articles with their "Summarize:" request) until it holds ~``--chars``
characters (the defaults: 9.6k–10.8k characters, 2.2k–2.4k Qwen2.5 tokens, three or four articles each), then asks for
each request to be answered in turn. Spec-Bench's own summarization and rag prompts are 400–900 tokens; these are the long kind the README's long-prompt figures are measured
on. Tasks come from index ``--skip`` on, so none is one of the first six prompts the ~700-token groups measure.

    python benchmarks/long_context_prompts.py --out /tmp/long6.jsonl
    .venv/bin/python benchmarks/draft_window.py --groups /tmp/long6.jsonl --windows 128,0 --methods draft_suffix
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.bench.datasets import load_prompts


def long_prompts(count: int, chars: int, skip: int) -> list[str]:
    tasks = [row.turns[0] for row in load_prompts("spec_bench", ["summarization"])][skip:]
    prompts, next_task = [], 0
    for _ in range(count):
        parts: list[str] = []
        while sum(map(len, parts)) < chars:
            if next_task == len(tasks):
                raise SystemExit(f"only {len(prompts)} prompts of {chars} characters fit in the {len(tasks)} tasks")
            parts.append(tasks[next_task])
            next_task += 1
        prompts.append("\n\n---\n\n".join(parts) + "\n\n---\n\nAnswer each of the requests above in turn, in order.")
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSONL to write ({'prompt': …} per line)")
    parser.add_argument("--count", type=int, default=6)
    parser.add_argument("--chars", type=int, default=9000, help="at least this many characters per prompt")
    parser.add_argument("--skip", type=int, default=10, help="summarization tasks to leave out first")
    args = parser.parse_args()
    prompts = long_prompts(args.count, args.chars, args.skip)
    args.out.write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in prompts))
    print(f"{len(prompts)} prompts, {min(map(len, prompts))}-{max(map(len, prompts))} characters -> {args.out}")


if __name__ == "__main__":
    main()
