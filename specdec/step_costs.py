"""Measured step-cost curves, and the execution mode ``--quantize auto`` picks from them.

Which CPU execution mode is fastest depends on the machine, not only on the model: on an AVX2 CPU
our int4 kernel decodes fastest but its verification cost grows ~10 ms per extra token (AVX2 has
no int8 dot product), while fbgemm's int8 stays nearly flat; on an AVX-512 VNNI CPU the same
int4-target + draft configuration ran at 0.96× plain decoding and an int8 target paid more. So
``auto`` decides by measurement: for each candidate mode it times a *probe* — two decoder layers of
the model's own shape with random weights (step time is shapes, not values) and a small LM head —
at chunk sizes T = 1, 2, 4, 8, scales it to the full depth and vocabulary, and caches the curve
per (CPU, shape, mode) under ``specdec_home()/step_costs``: a few seconds once per machine.

The choice (:mod:`specdec.cost_model`) then maximises expected tokens per second: plain decoding
takes the cheapest single step; a drafter with prior acceptance α and draft cost D per token takes
the mode with the best ``E(α, γ) / (V(γ + 1) + γ·D)`` over γ; a server, the mode with the most total
tokens/s at its ``--max-num-seqs`` concurrent requests. Every candidate is exact (batch-invariant),
so the choice moves speed only, never the output.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec.cost_model import Curve, ModeChoice, choose_mode, choose_mode_for_load, flat_verification_note
from specdec.cpu import cpu_signature, cpu_ticks, other_cpu_share
from specdec.huge_pages import huge_pages_supported
from specdec.kernels.build import available as kernels_available
from specdec.kernels.build import amx_key, build_key, kernel_path, kernel_paths, unsupported_reason
from specdec.models.config import ModelConfig
from specdec.paths import specdec_home
from specdec.step_probe import measure_curves

log = logging.getLogger(__name__)

#: a probe timed while other processes used more than this share of the CPU is not cached: a curve
#: cached while something else ran put the 1.5B int8 step at 69 ms where the quiet machine measures
#: 49.6 (and int4 at 37.1 for 31.0; Zen 4 EPYC), and every later choice read it
MAX_OTHER_CPU_SHARE = 0.1
#: bump when the way curves are measured changes (3: measured up to 32 rows; 4: the AVX-512 VNNI dot
#: products, which flatten the int4 curve where the CPU has them; 5: the probe's weights are evicted
#: from the CPU caches before every timed forward; 6: not cached when timed busy; 7: the probe's weights on
#: transparent huge pages, as every loaded CPU model's are: ~10 % off a single-token step, less off
#: chunks). A change to the C++ kernels needs no bump: the cache file is also keyed by their build
#: (``kernels.build.build_key``).
CURVE_VERSION = 7
#: a choice between modes whose expected rates lie within this fraction of each other is timed again —
#: the probe of every candidate, the minimum per size kept — until MAX_PROBES probes made the curves.
#: Why: the busy check reads /proc/stat, which does not see a neighbour's memory traffic; a probe in
#: such a minute put the 1.5B int8 step at 41-56 ms where the model runs it in 32 (Zen 4 EPYC, session
#: 26), and the choice it steered stayed for every run of that build.
CLOSE_CHOICE = 0.15
MAX_PROBES = 3
#: ... at least this far apart: contention here came and went over tens of minutes, so runs started
#: back to back would spend every probe on the same bad minute
PROBE_SPACING_S = 600.0
#: the cache entry's keys for how many probes each mode's curve is the minimum of (absent: 1), and when
#: the last one ran (absent: long ago)
PROBES_KEY = "_probes"
PROBED_AT_KEY = "_probed_at"
#: acceptance assumed before a request has been seen, per token (the α of the geometric model,
#: cost_model/adaptive.expected_tokens: accepted ÷ acceptance trials). The 0.5B/1.5B Qwen pair's
#: accepted ÷ *proposed* ratio on code is 0.62-0.73 at γ=4 on both machine kinds — the same rounds give a
#: per-token α of 0.82-0.88 (HumanEval, Zen 4) — and this prior was once 0.7 from that ratio: in the
#: per-token formula it undercounted every long draft, and `--quantize auto` kept an int4 target that
#: speculated 1.12-1.27× slower than int8 on an AVX-512 VNNI EPYC (session 26). Draft-free methods
#: (suffix, n-gram) propose far less often.
PRIOR_ALPHA = {"draft": 0.8, "free": 0.5}


def _shape_key(cfg: ModelConfig) -> str:
    return (f"{cfg.arch}-h{cfg.hidden_size}-i{cfg.intermediate_size}-l{cfg.num_layers}-a{cfg.num_heads}x{cfg.head_dim}"
            f"-kv{cfg.num_kv_heads}-v{cfg.vocab_size}")


def _cache_path(threads: int | None) -> Path:
    """This CPU's curves at ``threads`` threads, measured with this build of the C++ kernels (a kernel
    change, say a new prefetch, moves every int4 curve; curves cached before it would steer
    ``--quantize auto`` and γ=auto by the old kernels' costs) on the kernel path in use: a path other
    than the CPU's best (``SPECDEC_KERNEL_PATH=avx2``, to see how an older CPU would fare) has its own
    curves — planned on the best path's, its γ=auto drafted as if its chunks cost what they do there.
    Each 4-bit AMX threshold (``SPECDEC_Q4_AMX_ROWS``) has its own curves too: it moves every int4 chunk's
    cost from that many rows on. Where models stay on 4 KiB pages (``SPECDEC_HUGE_PAGES=0``, or no
    transparent huge pages) the curves are their own as well (``-4k``)."""
    threads = threads or torch.get_num_threads()
    kernels = "none"
    if unsupported_reason() is None:
        kernels = build_key()
        if kernels_available():  # (int8's fbgemm curves are measured without the C++ kernels)
            path = kernel_path()
            kernels += "" if path == kernel_paths()[0] else f"-{path}"
            kernels += amx_key()
    kernels += "" if huge_pages_supported() else "-4k"
    return specdec_home() / "step_costs" / f"{cpu_signature()}-t{threads}-v{CURVE_VERSION}-k{kernels}.json"


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        return {}  # unreadable: measure again and overwrite


def measured_seconds(cfg: ModelConfig, mode: str, max_tokens: int = 9) -> dict[int, float]:
    """Forward seconds for T = 1 .. ``max_tokens`` tokens of ``cfg``'s shape in ``mode`` from this CPU's
    cached curve, timing the probe first where this CPU has no curve for ``cfg``'s shape in
    ``mode`` (once per machine: 17 s for the 1.5B int8 shape on 2 cores; cached unless the machine was busy). What loading a
    model in an explicit CPU mode (``--quantize int8``) does: without a curve, γ=auto's first
    rounds would plan on flat costs and a server's ``--disable-speculation-above auto`` would have
    no γ per load — speculation and trees at full size however many requests share a forward (0.72×
    plain at 8 concurrent requests on an AMX Xeon, session 41)."""
    curve = curves_for(cfg, (mode,))[mode]
    return {tokens: curve.cost(tokens) for tokens in range(1, max_tokens + 1)}


def full_curve(cfg: ModelConfig, mode: str) -> dict[int, float] | None:
    """The cached curve of ``cfg`` in ``mode`` at every measured size (up to 32 rows: what the
    server's γ per number of requests reads), or None when none is cached on this CPU."""
    entry = _read_cache(_cache_path(None)).get(_shape_key(cfg), {}).get(mode)
    return None if not entry else _cached_curve(mode, entry).seconds


def draft_curve(cfg: ModelConfig, mode: str, vocab_limit: int | None) -> dict[int, float] | None:
    """A draft model's cached curve as it drafts: with the head cut to ``vocab_limit`` ids where
    ``--draft-vocab-size`` cuts it and that curve was timed (--quantize auto times it), else its
    whole vocabulary's (an upper bound)."""
    if vocab_limit and vocab_limit < cfg.vocab_size:
        limited = full_curve(dataclasses.replace(cfg, vocab_size=vocab_limit), mode)
        if limited:
            return limited
    return full_curve(cfg, mode)


def _cached_curve(mode: str, entry: dict[str, float]) -> Curve:
    """A curve as the cache file stores it (JSON keys are strings) → a :class:`Curve`."""
    return Curve(mode, {int(t): float(s) for t, s in entry.items()})


def _probe(cfg: ModelConfig, modes: tuple[str, ...]) -> tuple[dict[str, Curve], float, bool]:
    """Time ``modes`` together (they share one moment of the machine): the curves, the share of the CPU
    other processes used meanwhile, and whether the curves may be cached (plausible, and that share at
    most :data:`MAX_OTHER_CPU_SHARE`)."""
    start = cpu_ticks()
    fresh = measure_curves(cfg, modes)
    busy = other_cpu_share(start)
    return fresh, busy, all(curve.plausible for curve in fresh.values()) and busy <= MAX_OTHER_CPU_SHARE


#: curves timed while the machine was busy, kept for the rest of this process only ((cache file, shape, mode) → curve)
_RUN_ONLY: dict[tuple[Path, str, str], Curve] = {}
#: the (cache file, shape, modes) whose :func:`refine_curves` probe this process timed while the machine was busy: not
#: tried again in this run (nothing was cached, so the probe spacing did not stop it: a walkthrough's bench printed the
#: same "probe 2 of at most 3" three times, ~17 s each)
_BUSY_REFINES: set[tuple[Path, str, tuple[str, ...]]] = set()


def curves_for(cfg: ModelConfig, modes: tuple[str, ...], threads: int | None = None) -> dict[str, Curve]:
    """Cached curves of ``cfg``'s shape for ``modes`` on this CPU (measured and saved when missing)."""
    path = _cache_path(threads)
    saved = _read_cache(path)
    entry = saved.setdefault(_shape_key(cfg), {})
    kept = {mode: _RUN_ONLY[(path, _shape_key(cfg), mode)] for mode in modes
            if mode not in entry and (path, _shape_key(cfg), mode) in _RUN_ONLY}
    missing = tuple(mode for mode in modes if mode not in entry and mode not in kept)
    if missing:
        log.info("timing %s step costs for this model shape on this CPU (once: cached in %s, unless other processes "
                 "are busy meanwhile)", ", ".join(missing), path)
    fresh, busy, trusted = _probe(cfg, missing) if missing else ({}, 0.0, True)
    if not trusted:
        log.warning("step costs timed while the machine was busy (other processes used %.0f%% of the CPU): "
                    "used for this run only, measured again next time", 100 * busy)
    for mode, curve in fresh.items():
        entry[mode] = {str(t): s for t, s in curve.seconds.items()}
        entry.setdefault(PROBED_AT_KEY, {})[mode] = time.time()
    curves = {mode: kept.get(mode) or fresh.get(mode) or _cached_curve(mode, entry[mode]) for mode in modes}
    if missing and trusted:
        _write_cache(path, saved)
    elif missing:  # not cached: the rest of this run reads them (a busy machine timed them 3× per generate before)
        _RUN_ONLY.update({(path, _shape_key(cfg), mode): fresh[mode] for mode in missing})
    return curves


def _write_cache(path: Path, saved: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(saved, indent=1))
    tmp.replace(path)


def refine_curves(cfg: ModelConfig, modes: tuple[str, ...], threads: int | None = None) -> dict[str, Curve] | None:
    """Time ``modes`` again (together, as :func:`curves_for` does) and cache, size by size, the lower
    of this probe and the cached curve: other load only adds time, so the minimum over probes taken at
    different moments is the machine's own cost. None — the cache left alone — when a mode has no
    cached curve yet, every mode's curve already is the minimum of :data:`MAX_PROBES` probes, or this
    probe was timed while other processes were busy. Not within :data:`PROBE_SPACING_S` of the last.
    (Seeded sampled requests plan from the cached curve: a refined curve can change their draft lengths,
    and so their tokens, between a process before it and one after — at most twice per build.)"""
    path = _cache_path(threads)
    saved = _read_cache(path)
    entry = saved.get(_shape_key(cfg), {})
    counts, probed_at = entry.setdefault(PROBES_KEY, {}), entry.setdefault(PROBED_AT_KEY, {})
    if any(mode not in entry for mode in modes) or all(counts.get(mode, 1) >= MAX_PROBES for mode in modes):
        return None
    if time.time() - max((probed_at.get(mode, 0.0) for mode in modes), default=0.0) < PROBE_SPACING_S:
        return None
    tried = (path, _shape_key(cfg), tuple(sorted(modes)))
    if tried in _BUSY_REFINES:  # a busy probe is not cached: a bench run timed the same modes again per method
        return None
    log.info("--quantize auto: %s within %.0f%% of each other; timing them again (probe %d of at most %d)",
             " and ".join(modes), 100 * CLOSE_CHOICE, 1 + max(counts.get(mode, 1) for mode in modes), MAX_PROBES)
    fresh, _, trusted = _probe(cfg, modes)
    if not trusted:
        _BUSY_REFINES.add(tried)
        return None
    for mode, curve in fresh.items():
        cached = _cached_curve(mode, entry[mode]).seconds
        entry[mode] = {str(t): min(seconds, cached.get(t, seconds)) for t, seconds in curve.seconds.items()}
        counts[mode] = counts.get(mode, 1) + 1
        probed_at[mode] = time.time()
    _write_cache(path, saved)
    return {mode: _cached_curve(mode, entry[mode]) for mode in modes}


def _close_call(choice: ModeChoice) -> bool:
    """Whether the runner-up's expected rate is within :data:`CLOSE_CHOICE` of the chosen mode's."""
    rates = sorted(choice.rates.values(), reverse=True)
    return len(rates) > 1 and rates[1] >= (1.0 - CLOSE_CHOICE) * rates[0]


@dataclass
class ExecutionPlan:
    """The execution modes ``--quantize auto`` picked for a target (and its draft model)."""

    target_mode: str
    draft_mode: str | None = None
    choice: ModeChoice | None = None
    draft_curves: dict[str, Curve] = field(default_factory=dict)

    @property
    def plain_mode(self) -> str:
        """The mode auto picks for plain decoding of this target, from the same measured curves."""
        return self.target_mode if self.choice is None else choose_mode(self.choice.curves).mode

    def explain(self) -> str:
        if self.choice is None:
            return f"execution: {self.target_mode} (no choice to measure: one candidate)"
        text = self.choice.explain()
        if self.draft_curves:
            costs = ", ".join(f"{m} {c.cost(1) * 1e3:.1f} ms" for m, c in self.draft_curves.items())
            text += f"\ndraft step (T=1): {costs}; chosen: {self.draft_mode}"
        return text


def cpu_candidates(cfg: ModelConfig, modes: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``modes`` that run here for this shape (int8 needs fbgemm; int4 our kernels and
    layer input sizes that are multiples of 64)."""
    from specdec.kernels.int8 import int8_available
    from specdec.kernels.q4 import PAIR

    int4_ok = all(size % PAIR == 0 for size in (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim))
    runnable = {"int8": int8_available(), "int4": int4_ok and kernels_available(), "int4-all": int4_ok and kernels_available()}
    return tuple(mode for mode in modes if runnable.get(mode, False))


#: prompts run in another execution mode only when its rows cost less than this share of the model's
#: own: the second copy of the weights (~1 GB for a 1.5B target) must buy a clear saving
PROMPT_MODE_MARGIN = 0.8


def choose_prompt_mode(cfg: ModelConfig, mode: str) -> str:
    """The CPU execution mode for this model's prompt passes when it decodes in ``mode``: the
    candidate whose rows cost least in a long forward (:meth:`Curve.row_seconds` of the measured
    curves), if below :data:`PROMPT_MODE_MARGIN` of ``mode``'s, else ``mode``. On a Zen 4 EPYC
    with AVX-512 VNNI an int4 target's prompt rows cost 8.6 ms and int8's 4.8 ms."""
    candidates = cpu_candidates(cfg, tuple(dict.fromkeys((mode, "int8", "int4"))))
    if mode not in candidates or len(candidates) < 2:
        return mode
    curves = curves_for(cfg, candidates)
    best = min(candidates, key=lambda m: curves[m].row_seconds())
    return best if curves[best].row_seconds() < PROMPT_MODE_MARGIN * curves[mode].row_seconds() else mode


def plan_execution(target_cfg: ModelConfig, draft_cfg: ModelConfig | None = None, drafting: str | None = None,
                   max_gamma: int = 8, draft_vocab: int | None = None, concurrency: int = 1) -> ExecutionPlan:
    """CPU modes for a target (and draft) by measured step costs. ``drafting``: None (plain
    decoding), ``"draft"`` (a draft model proposes: its step cost counts) or ``"free"`` (a table
    proposes at no model cost). ``draft_vocab``: the draft scores only its first ``draft_vocab``
    token ids (``--draft-vocab-size``), so its step is timed with that head. ``concurrency`` > 1:
    the target mode that serves that many requests at once fastest (a server's ``--max-num-seqs``,
    :func:`specdec.cost_model.choose_mode_for_load`), not the fastest for one."""
    targets = cpu_candidates(target_cfg, ("int8", "int4"))
    if not targets:
        return ExecutionPlan("none")
    draft_mode, draft_seconds, draft_curves = None, 0.0, {}
    if draft_cfg is not None:
        if draft_vocab and draft_vocab < draft_cfg.vocab_size:
            draft_cfg = dataclasses.replace(draft_cfg, vocab_size=draft_vocab)
        drafts = cpu_candidates(draft_cfg, ("int8", "int4-all"))
        if drafts:
            draft_curves = curves_for(draft_cfg, drafts)
            draft_mode = min(drafts, key=lambda m: draft_curves[m].cost(1))  # drafting is single steps
            draft_seconds = draft_curves[draft_mode].cost(1) if drafting == "draft" else 0.0
        else:
            draft_mode = "none"
    if len(targets) == 1:
        return ExecutionPlan(targets[0], draft_mode, None, draft_curves)
    alpha = None if drafting is None else PRIOR_ALPHA["draft" if drafting == "draft" else "free"]
    drafting_curve = draft_curves[draft_mode].seconds if drafting == "draft" and draft_curves else None

    def choose(curves: dict[str, Curve]) -> ModeChoice:
        if concurrency > 1:
            return choose_mode_for_load(curves, concurrency, alpha, drafting_curve, max_gamma)
        return choose_mode(curves, alpha, draft_seconds, max_gamma)

    choice = choose(curves_for(target_cfg, targets))
    if _close_call(choice):  # a probe from a contended minute may have decided it: time the candidates again
        refined = refine_curves(target_cfg, targets)
        if refined is not None:
            choice = choose(refined)
    note = flat_verification_note(choice, max_gamma) if concurrency == 1 else None
    if note is not None:
        choice.notes.append(note)
    return ExecutionPlan(choice.mode, draft_mode, choice, draft_curves)
