#!/bin/bash
# Time to first token, HEAD~ (a worktree at OLD, default /tmp/old-wt, .venv linked) against this tree,
# interleaved A B A B. Run from the repository root.
OLD=${OLD:-/tmp/old-wt}
SCRIPT=$(cd "$(dirname "$0")" && pwd)/prefill_scaling.py
for round in 1 2; do
  for tree in "$OLD" "$PWD"; do
    echo "== $tree round $round"
    (cd "$tree" && PYTHONPATH="$tree" .venv/bin/python "$SCRIPT" 512 1024 2048 3072 2>&1 | grep "^n=")
  done
done
