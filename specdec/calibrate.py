"""`specdec calibrate-skip`: which layers should the layer-skip drafter skip on this machine?

Draft & Verify searches the skip set with Bayesian optimisation on acceptance; we search on what the
user pays for — **measured decode tokens/s** of real speculative runs on calibration prompts — with a
budgeted search: structured seeds (contiguous blocks and alternating layers in the upper half, at
several sizes, where skipping costs the least quality), then a local search that toggles one layer
at a time around the best set. Plain decoding is timed before and after, interleaved, so the result
carries its own baseline. The result is saved per model file and execution dtype under
``$SPECDEC_HOME/calibration`` and ``--skip-layers auto`` reads it back.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specdec.config import SpecConfig
from specdec.engine import generate_ids
from specdec.errors import SpecdecError
from specdec.drafters.layer_skip import calibration_path
from specdec.sampling import SamplingParams, make_generator
from specdec.stats import aggregate


@dataclass
class Trial:
    skip_layers: list[int]
    tokens_per_s: float
    acceptance_rate: float
    mean_accepted_len: float
    draft_cost_ratio: float


@dataclass
class CalibrationResult:
    plain_tokens_per_s: float
    best: Trial
    trials: list[Trial] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "skip_layers": self.best.skip_layers,
            "tokens_per_s": round(self.best.tokens_per_s, 3),
            "plain_tokens_per_s": round(self.plain_tokens_per_s, 3),
            "speedup": round(self.best.tokens_per_s / self.plain_tokens_per_s, 3) if self.plain_tokens_per_s else 0.0,
            "acceptance_rate": round(self.best.acceptance_rate, 4),
            "mean_accepted_len": round(self.best.mean_accepted_len, 4),
            "draft_cost_ratio": round(self.best.draft_cost_ratio, 4),
            "trials": [t.__dict__ for t in self.trials],
        }


def seed_candidates(num_layers: int) -> list[list[int]]:
    """Skip sets worth trying first: blocks and alternating layers of the upper half, several sizes.
    The first and last layers are never skipped (they carry the embedding/prediction interface)."""
    upper = list(range(num_layers // 2, num_layers - 1))
    candidates: list[list[int]] = []
    for fraction in (0.25, 0.375, 0.5):
        size = max(1, round(num_layers * fraction))
        alternating = list(range(1, num_layers - 1, 2))[-size:]
        candidates.append(alternating)
        if size <= len(upper):
            candidates.append(upper[-size:])  # a block just below the last layer
            candidates.append(upper[:size])  # a block starting mid-way
    unique: list[list[int]] = []
    for skip in candidates:
        skip = sorted(set(skip))
        if skip and skip not in unique:
            unique.append(skip)
    return unique


def neighbour(skip: list[int], num_layers: int, rng: random.Random) -> list[int]:
    """Toggle one inner layer in or out of the skip set (never leaving it empty or full)."""
    inner = list(range(1, num_layers - 1))
    while True:
        layer = rng.choice(inner)
        candidate = sorted(set(skip) ^ {layer})
        if candidate and len(candidate) < num_layers - 1:
            return candidate


def calibrate_skip(
    target,  # noqa: ANN001 - specdec.api.LoadedModel
    prompts: list[list[int]],
    max_tokens: int = 48,
    gamma: int = 4,
    budget: int = 16,
    seed: int = 0,
    on_trial: Callable[[Trial, int], None] | None = None,
) -> CalibrationResult:
    """Measure plain decoding, then up to ``budget`` skip sets; returns the fastest (by tokens/s)."""
    from specdec.api import make_drafter

    if budget < 1:
        raise SpecdecError("--budget must be >= 1")
    if not prompts:
        raise SpecdecError("calibration needs at least one prompt")
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    backend, tokenizer = target.backend, target.tokenizer
    num_layers = backend.config.num_layers
    if num_layers < 3:
        raise SpecdecError(f"layer skip needs a model with at least 3 layers (this one has {num_layers})")

    def run(spec: SpecConfig) -> dict:
        """Totals over the calibration prompts (ratios of sums, via stats.aggregate)."""
        outs = []
        for ids in prompts:
            generator = make_generator(0)
            drafter = make_drafter(target, spec, params, generator, len(ids) + max_tokens + gamma + 1) if spec.method else None
            outs.append(generate_ids(backend, ids, params, drafter, spec, tokenizer, generator))
        return aggregate(o.stats for o in outs)

    run(SpecConfig())  # warm-up: first calls allocate and fill caches
    plain_rates = [run(SpecConfig())["tokens_per_s"]]
    rng = random.Random(seed)
    queue = seed_candidates(num_layers)
    trials: list[Trial] = []
    tried: set[tuple[int, ...]] = set()
    while len(trials) < budget:
        if queue:
            skip = queue.pop(0)
        else:
            best = max(trials, key=lambda t: t.tokens_per_s)
            skip = neighbour(best.skip_layers, num_layers, rng)
        if tuple(skip) in tried:
            if not queue and len(tried) >= 2 ** (num_layers - 2) - 1:
                break  # a tiny model: every set tried
            continue
        tried.add(tuple(skip))
        totals = run(SpecConfig(method="layer_skip", num_speculative_tokens=gamma, skip_layers=list(skip)))
        trial = Trial(skip_layers=list(skip), tokens_per_s=totals["tokens_per_s"], acceptance_rate=totals["acceptance_rate"],
                      mean_accepted_len=totals["mean_accepted_len"], draft_cost_ratio=totals["draft_cost_ratio"])
        trials.append(trial)
        if on_trial is not None:
            on_trial(trial, len(trials))
    plain_rates.append(run(SpecConfig())["tokens_per_s"])  # again at the end: the machine's drift is in the baseline
    best = max(trials, key=lambda t: t.tokens_per_s)
    return CalibrationResult(statistics.median(plain_rates), best, trials)


def save_calibration(result: CalibrationResult, model_path: Path | str, dtype_name: str, meta: dict) -> Path:
    path = calibration_path(model_path, dtype_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {**result.to_dict(), **meta, "model_path": str(Path(model_path).resolve()), "dtype": dtype_name,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
    return path
