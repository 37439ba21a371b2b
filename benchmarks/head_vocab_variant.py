"""A trained head's twin that scores the ids most frequent in its training data instead of the first
ids — the same weights, only the LM head rows differ — to measure what the draft vocabulary alone
costs (issue 23; ``specdec train-drafter --draft-vocab frequency`` does this when it trains).

    .venv/bin/python benchmarks/head_vocab_variant.py HEAD OUT [--size N]
    .venv/bin/python benchmarks/trained_drafters.py --eagle HEAD --eagle OUT --head-gammas 1 --groups humaneval

An EAGLE or Medusa head predicts features (or hidden states) that the target's own LM head scores,
so the rows it scores can change without retraining (its token loss saw only the old rows: a head
trained with the new ones may do better still). Ids: ``specdec.train.vocab.frequency_ids`` over the
target's greedy tokens in HEAD/features (the shards it trained on); OUT gets a copy of the weights
with the ids added.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdec.models.head_files import CONFIG_FILE, WEIGHTS_FILE  # noqa: E402
from specdec.train.pipeline import ON_POLICY_HELD_OUT  # noqa: E402
from specdec.train.vocab import coverage, frequency_ids  # noqa: E402


def training_target_ids(head_dir: Path) -> torch.Tensor:
    """Every training shard's ``target_ids`` (generated and extracted), flattened (-1 = padding)."""
    from safetensors import safe_open

    parts = []
    for shard in sorted((head_dir / "features").glob("*/shard-*.safetensors")):
        if shard.parent.name.startswith("held_out"):  # held_out, held_out_generated: not training data
            continue
        with safe_open(str(shard), framework="pt") as data:
            parts.append(data.get_tensor("target_ids").flatten())
    if not parts:
        raise SystemExit(f"{head_dir}/features holds no training shards")
    return torch.cat(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("head", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", type=int, default=0, help="ids to score (default: the head's draft_vocab_size)")
    args = parser.parse_args()
    from safetensors.torch import load_file, save_file

    config = json.loads((args.head / CONFIG_FILE).read_text())
    size = args.size or config["draft_vocab_size"]
    targets = training_target_ids(args.head)
    ids = frequency_ids(targets, size, config["vocab_size"])
    held = args.head / "features" / ON_POLICY_HELD_OUT  # the target's continuations of held-out prompts …
    if not held.is_dir():  # … or, for a run on source text alone, the held-out source
        held = args.head / "features" / "held_out"
    held_targets = torch.cat([load_file(str(p))["target_ids"].flatten() for p in sorted(held.glob("shard-*.safetensors"))])
    print(f"{size} ids: training tokens covered {coverage(targets, None, size):.2%} (first ids) → "
          f"{coverage(targets, ids, size):.2%} (frequency); held-out {coverage(held_targets, None, size):.2%} → "
          f"{coverage(held_targets, ids, size):.2%}")
    args.out.mkdir(parents=True, exist_ok=True)
    weights = load_file(str(args.head / WEIGHTS_FILE))
    weights["draft_ids"] = ids
    save_file(weights, str(args.out / WEIGHTS_FILE))
    config.update(draft_vocab="frequency", draft_vocab_size=size)
    (args.out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
