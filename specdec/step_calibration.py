"""The loaded model's own step costs: the probe's curve rescaled by a few timed forwards of the model.

:mod:`specdec.step_costs` times a *probe* (two random layers of the model's shape) once per machine and
caches the curve; γ=auto, the "does drafting pay back the draft's prompt pass" decision and the
server's γ per load all start from it. The probe can be wrong in ways no later run corrects: it
is timed with its weights evicted from the caches (a cold start the real model's streaming steps do
not pay), at one moment of a shared machine that a load check cannot always see. Measured on a
Zen 4 EPYC (int4 1.5B target, int4-all 0.5B draft, min of 15 interleaved forwards vs the cached
curve): target T=1 28.4 ms real vs 35.4 probe, T=2 33.0 vs 33.8 — the probe said verifying one
drafted token costs *less* than a plain step — and the draft's step 10.4 vs 13.6 ms, so every
request planned with a draft 30 % dearer than it is. A draft curve cached in a busy moment switched
drafting off for a whole benchmark run (session 24).

So after loading, each CPU model times a few real forwards (T = 1, 2, 4 tokens after a short
context, the minimum of a few repeats: ~0.7 s for a 1.5B int4 target, ~0.3 s for a 0.5B draft) and
keeps real ÷ probe per size (``Backend.step_ratios``). The probe still gives the curve's shape where
it was not timed (larger chunks, a draft's cut head); the real model gives its level.

Every request plans with the rescaled curve, seeded sampled ones too: their draft lengths never
change their text (:mod:`specdec.seeded`).
"""

from __future__ import annotations

import logging
import math
import time

from specdec import step_costs
from specdec.backends.base import Backend
from specdec.cost_model import Curve

log = logging.getLogger(__name__)

#: chunk sizes timed on the real model: a plain step, and verifications of 1 and 3 drafted tokens
#: (γ=auto on a CPU mostly drafts 1-3); larger chunks take the ratio of the nearest timed size
CALIBRATION_SIZES = (1, 2, 4)
CALIBRATION_REPEATS = 5
#: tokens in the cache before the timed chunk (short: its prefill is paid at every load)
CALIBRATION_CONTEXT = 8


def time_real_steps(backend: Backend, sizes: tuple[int, ...] = CALIBRATION_SIZES,
                    repeats: int = CALIBRATION_REPEATS) -> dict[int, float]:
    """Seconds of a forward of T tokens (each T in ``sizes``) of the loaded model after a short
    context: the minimum over ``repeats`` rounds, sizes interleaved within a round (other load
    only adds time, and a busy moment then costs every size alike)."""
    vocab = backend.config.vocab_size
    tokens = [(7919 * i + 13) % vocab for i in range(CALIBRATION_CONTEXT + max(sizes))]
    state = backend.new_state(len(tokens) + 1)
    backend.prompt_backend.forward(state, tokens[:CALIBRATION_CONTEXT], num_logits=1)
    best: dict[int, float] = {}
    for _ in range(repeats):
        for size in sizes:
            state.truncate(CALIBRATION_CONTEXT)
            start = time.perf_counter()
            backend.forward(state, tokens[CALIBRATION_CONTEXT : CALIBRATION_CONTEXT + size], num_logits=size)
            best[size] = min(best.get(size, math.inf), time.perf_counter() - start)
    return best


def rescaled(curve: dict[int, float] | None, ratios: dict[int, float]) -> dict[int, float] | None:
    """``curve`` (T → seconds) with each size scaled by the ratio of the nearest timed size (the
    smaller one on a tie); the curve itself where nothing was timed."""
    if not curve or not ratios:
        return curve
    return {size: seconds * ratios[min(ratios, key=lambda timed: (abs(timed - size), timed))]
            for size, seconds in curve.items()}


def planning_curve(backend: Backend) -> dict[int, float] | None:
    """The step costs a request plans with: the probe's curve rescaled to the loaded model."""
    return rescaled(backend.step_seconds, backend.step_ratios)


def batch_curve(backend: Backend) -> dict[int, float] | None:
    """The step costs batched work is planned with (a server's γ per load, self-distillation's
    concurrency): the probe's curve up to 32 rows where cached on this CPU, else the backend's own,
    rescaled to the loaded model; None where nothing was measured (float weights, CUDA)."""
    return rescaled(step_costs.full_curve(backend.config, backend.mode) or backend.step_seconds, backend.step_ratios)


def prompt_row_seconds(backend: Backend) -> float:
    """Seconds one more prompt row costs ``backend`` in its prompt mode (its prompt twin's, where it has
    one: :meth:`Curve.row_seconds` of the probe's curve up to 32 rows where cached, else the twin's own);
    0 where unmeasured. What a draft's pass over a new prompt, or a prompt's pass in self-distillation,
    costs per token."""
    prompts = backend.prompt_backend
    curve = step_costs.full_curve(backend.config, prompts.mode) or prompts.step_seconds
    return Curve(prompts.mode, curve).row_seconds() if curve else 0.0


def calibrate(backend: Backend) -> dict[int, float]:
    """Time the loaded model (:func:`time_real_steps`) and set ``backend.step_ratios`` to real ÷
    probe per timed size; returns them ({} where there is no probe curve to rescale: float
    weights, CUDA, or a shape whose costs were never measured — or where the model's context is
    shorter than the timed chunks)."""
    if not backend.step_seconds:
        return {}
    if backend.config.max_position_embeddings <= CALIBRATION_CONTEXT + max(CALIBRATION_SIZES):
        return {}  # a context too short to time the chunks in (a toy config): the probe's curve as it is
    probe = Curve(backend.mode, backend.step_seconds)
    real = time_real_steps(backend)
    backend.step_ratios = {size: seconds / probe.cost(size) for size, seconds in real.items()}
    log.info("step costs of the loaded %s model: %s", backend.mode,
             ", ".join(f"T={size} {seconds * 1e3:.1f} ms (probe {probe.cost(size) * 1e3:.1f})"
                       for size, seconds in real.items()))
    return backend.step_ratios
