"""What decoding costs, from measured step-cost curves: the decisions, not the measuring.

A :class:`Curve` is one model shape's forward time by number of rows in one execution mode (measured
by :mod:`specdec.step_costs` on this CPU). From curves this module answers three questions:

- which execution mode decodes one request fastest, plainly or speculating (:func:`choose_mode`,
  what ``--quantize auto`` picks for ``generate``/``run``/``bench``);
- how many tokens N requests stepped together may draft before verification rows cost more than they
  save (:func:`batch_gammas`: the server's γ per number of requests, vLLM's
  ``num_speculative_tokens_per_batch_size`` by measurement);
- which mode serves N concurrent requests fastest (:func:`choose_mode_for_load`, what ``serve``'s
  ``--quantize auto`` picks: the fastest mode for one request is not the fastest under load — on an
  AVX-512 VNNI EPYC our int4 decodes one request 1.7× faster than fbgemm's int8 while int8 served 8
  concurrent requests at 1.75× int4's total tokens/s, its rows and prompts being cheaper).

Every candidate mode is exact (batch-invariant), so these choices move speed only, never an output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from specdec.adaptive import expected_tokens
from specdec.cpu import cpu_description

#: a step reading weights slower than this was measured on a busy machine (these CPUs stream
#: 20-30 GB/s): the curve is used for this run but not cached, so the next run measures again
MIN_PLAUSIBLE_GB_S = 3.0
#: speculation under load must beat plain decoding by this factor to be chosen: the prior α and the
#: curves extrapolated to many rows are estimates, and a predicted gain below 5 % is within their error
BATCH_SPECULATION_MARGIN = 1.05
#: prompt tokens a server prefills per token it generates, when choosing its mode for a load: the
#: request shape is unknown at start-up, and prefill is most of a CPU server's work under load (a
#: 130-token prompt with a 64-token answer: 8 concurrent requests spent ~40 % of their time in
#: prefill forwards, serve-load.md); 1 is between code completion (~2) and chat (~0.5)
PROMPT_TOKENS_PER_GENERATED = 1.0


@dataclass
class Curve:
    """Seconds of one forward of T tokens (T → s) for a model shape in one execution mode."""

    mode: str
    seconds: dict[int, float]
    #: weight bytes per T=1 step / its time: a probe timed while other processes held the cores
    #: reads far below the memory bandwidth, and is then not cached (see step_costs.curves_for)
    gb_per_s: float = 0.0
    weight_gb: float = 0.0  # of the full model in this mode

    def __post_init__(self) -> None:
        # A forward of more rows never costs less than one of fewer: where a measurement says so it is
        # noise (a busy minute under the smaller size), and a falling last segment extrapolated to the
        # rows of 32 requests' drafts once gave int8 a negative cost and -85.6 tokens/s (a busy 2-core
        # Xeon). Each size costs at least what every smaller size measured.
        monotone, most = {}, 0.0
        for tokens, seconds in sorted(self.seconds.items()):
            most = max(most, seconds)
            monotone[tokens] = most
        self.seconds = monotone

    @property
    def plausible(self) -> bool:
        """Small models are call overhead, not bytes: only a big one's bandwidth says anything."""
        return self.weight_gb < 0.1 or self.gb_per_s >= MIN_PLAUSIBLE_GB_S

    def cost(self, tokens: int) -> float:
        known = sorted(self.seconds.items())
        if tokens <= known[0][0]:
            return known[0][1]
        for (t0, s0), (t1, s1) in zip(known, known[1:]):
            if tokens <= t1:
                return s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)
        return known[-1][1] + self.row_seconds() * (tokens - known[-1][0])  # beyond the last size: its slope

    def row_seconds(self) -> float:
        """Seconds one more row adds at the largest measured sizes: a prompt token's share of a long
        prefill (compute, once the weights' streaming is shared by enough rows)."""
        known = sorted(self.seconds.items())
        if len(known) < 2:
            return known[0][1]
        (t0, s0), (t1, s1) = known[-2], known[-1]
        last = (s1 - s0) / (t1 - t0)
        if last > 0:
            # One more row never costs more than the cheapest average per row measured (a forward's fixed part only
            # shares out): a probe slowed by a neighbour at its largest size is a steep last slope, and a draft's
            # 3k-token catch-up extrapolated from one was "~238440 ms" where it took 4.3 s (a walkthrough).
            return min(last, min(seconds / tokens for tokens, seconds in known))
        # flattened by noise (__post_init__; a tiny model's probe is call overhead): long prefills are not
        # free — the whole curve's slope, or where that is flat too the largest size's cost per row (an
        # upper bound: a 0 here once chose an int4 prompt twin for a tiny int8 server)
        whole = (s1 - known[0][1]) / (t1 - known[0][0])
        return whole if whole > 0 else s1 / t1


@dataclass
class ModeChoice:
    """What ``auto`` chose and why (``specdec generate --explain`` prints :meth:`explain`)."""

    mode: str
    curves: dict[str, Curve]
    rates: dict[str, float]  # expected tokens/s per candidate mode
    gammas: dict[str, int]  # the γ that rate assumes
    alpha: float | None = None
    draft_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    requests: int = 1  # concurrent requests the rates are for (serve: --max-num-seqs)

    def explain(self) -> str:
        lines = [f"CPU: {cpu_description()}"]
        sizes = sorted({t for c in self.curves.values() for t in c.seconds})
        lines.append("step cost (ms) | " + " | ".join(f"T={t}" for t in sizes) + " | expected tok/s | γ")
        for mode, curve in self.curves.items():
            cells = " | ".join(f"{curve.cost(t) * 1e3:.1f}" for t in sizes)
            lines.append(f"{mode:>14} | {cells} | {self.rates.get(mode, 0):.1f} | {self.gammas.get(mode, 0)}")
        if self.alpha is not None:
            lines.append(f"assumed acceptance α={self.alpha:.2f}, draft step {self.draft_seconds * 1e3:.1f} ms")
        lines.extend(self.notes)
        lines.append(f"chosen: {self.mode}")
        return "\n".join(lines)

    def summary(self) -> str:
        """One line: the choice and the expected rates it was made from."""
        rates = ", ".join(f"{mode} {rate:.1f}" for mode, rate in sorted(self.rates.items(), key=lambda item: -item[1]))
        load = f" at {self.requests} concurrent requests" if self.requests > 1 else ""
        return f"execution: {self.mode} (expected tokens/s{load}, by step costs measured on this CPU: {rates})"


def best_rate(curve: Curve, alpha: float | None, draft_seconds: float, max_gamma: int) -> tuple[float, int]:
    """(expected tokens/s, γ) of the best γ in 0..max_gamma; α None = plain decoding (γ = 0)."""
    best = (1.0 / curve.cost(1), 0)
    if alpha is None:
        return best
    for gamma in range(1, max_gamma + 1):
        rate = expected_tokens(alpha, gamma) / (curve.cost(gamma + 1) + gamma * draft_seconds)
        best = max(best, (rate, gamma))
    return best


def choose_mode(curves: dict[str, Curve], alpha: float | None = None, draft_seconds: float = 0.0,
                max_gamma: int = 8) -> ModeChoice:
    """The candidate with the highest expected tokens/s for one request (ties: the first given)."""
    rates, gammas = {}, {}
    for mode, curve in curves.items():
        rates[mode], gammas[mode] = best_rate(curve, alpha, draft_seconds, max_gamma)
    mode = max(curves, key=lambda m: rates[m])
    return ModeChoice(mode, curves, rates, gammas, alpha, draft_seconds)


#: a mode whose (max γ + 1)-token forward costs at most this many single steps verifies long drafts nearly
#: free; where the chosen mode's costs more than FLATNESS_GAP times as much, --explain says so (below)
FLAT_VERIFICATION = 1.3
FLATNESS_GAP = 1.5


def flat_verification_note(choice: ModeChoice, max_gamma: int = 8) -> str | None:
    """A line for ``--explain`` when another mode verifies long drafts nearly free and the chosen one
    does not: the expectation that chose (one α, tokens accepted independently) cannot see runs of
    accepted tokens, which is what such a mode turns into speed on code — the int8 target on an AMX
    Xeon ran draft_suffix 1.17× the chosen int4's on HumanEval and 0.93–1.07× on chat and long
    prompts (session 44), so it is a hint to measure, not a choice. None when there is nothing to say."""
    rows = max_gamma + 1
    slope = {mode: curve.cost(rows) / curve.cost(1) for mode, curve in choice.curves.items()}
    flat = [mode for mode in slope if mode != choice.mode and slope[mode] <= FLAT_VERIFICATION]
    if choice.alpha is None or not flat or slope[choice.mode] < FLATNESS_GAP * slope[flat[0]]:
        return None
    return (f"{flat[0]} verifies {rows} tokens for {slope[flat[0]]:.2f}× its single step here ({choice.mode}: "
            f"{slope[choice.mode]:.2f}×): where drafts are accepted in runs (code, copies) it can speculate faster than "
            f"{choice.mode} — `specdec tune` measures both modes on your prompts")


def draft_rows_cost(draft_step_seconds: dict[int, float] | None) -> Callable[[int], float]:
    """Seconds of one draft-model forward of N rows (the draft steps of N requests, batched): its
    curve; a single measured point is taken as growing linearly with rows; None or empty: drafting
    costs no model (a table)."""
    if draft_step_seconds and len(draft_step_seconds) > 1:
        return Curve("draft", dict(draft_step_seconds)).cost
    one = next(iter(draft_step_seconds.values())) if draft_step_seconds else 0.0
    return lambda rows: rows * one


def batch_rate(curve: Curve, requests: int, alpha: float | None, draft_cost: Callable[[int], float],
               max_gamma: int, plain_margin: float = 1.0, draft_prompt_s_per_token: float = 0.0) -> tuple[float, int]:
    """(tokens/s of all requests together, γ) for ``requests`` requests stepped together, at the best
    γ in 0..max_gamma (α None: plain decoding). Plain decoding commits N tokens per forward of N rows;
    speculation with γ commits N·τ(α, γ) per forward of N·(γ+1) rows plus γ draft forwards of N rows,
    plus the draft model's pass over the prompts those tokens came with (``draft_prompt_s_per_token``
    seconds per committed token: its seconds per prompt row × the traffic's prompt rows per generated
    token; work plain decoding never does).
    Speculation is chosen only when it beats plain decoding's rate × ``plain_margin``."""
    plain = requests / curve.cost(requests)
    best_rate_, best_gamma, to_beat = plain, 0, plain * plain_margin
    for gamma in range(1, max_gamma + 1) if alpha is not None else ():
        rate = speculation_rate(curve, requests, alpha, gamma, draft_cost, draft_prompt_s_per_token)
        if rate > to_beat:
            best_rate_, best_gamma, to_beat = rate, gamma, rate
    return best_rate_, best_gamma


def speculation_rate(curve: Curve, requests: int, alpha: float, gamma: int, draft_cost: Callable[[int], float],
                     draft_prompt_s_per_token: float = 0.0) -> float:
    """Tokens/s of ``requests`` requests stepped together, each drafting ``gamma`` (see :func:`batch_rate`)."""
    committed = requests * expected_tokens(alpha, gamma)
    return committed / (curve.cost(requests * (gamma + 1)) + gamma * draft_cost(requests)
                        + committed * draft_prompt_s_per_token)


def batch_gammas(step_seconds: dict[int, float] | None, alpha: float, gamma: int | None,
                 draft_step_seconds: dict[int, float] | None, max_requests: int, max_gamma: int = 8,
                 draft_prompt_s_per_token: float = 0.0) -> dict[int, int] | None:
    """γ per number of concurrent requests, from the measured curves (what vLLM's
    ``num_speculative_tokens_per_batch_size`` sets by hand): ``{N: γ}`` for N = 1..max_requests,
    0 where speculation is expected to lose to plain decoding (and for every larger N after the first
    such one); None when the target's step costs were never measured (then nothing is capped).

    N requests share forwards (:func:`batch_rate`; the draft model's steps are batched too:
    specdec.scheduler). ``draft_step_seconds``: the draft model's curve (:func:`draft_rows_cost`).
    On a CPU whose forward cost grows with rows (AVX2 int8: 8 decode rows cost 1.4× one, 40
    verification rows 4×+) speculation pays only for a few requests, with shorter drafts as they
    grow; where the curve is flat (VNNI, GPU) for more. The curve beyond its largest measured size
    follows its last slope — an underestimate of many-row forwards (measured:
    benchmarks/results/2026-11-25/ragged-step-int8.md), so this errs toward speculating. ``gamma``:
    the requests' γ, the most any N gets (None: γ=auto, up to ``max_gamma``). ``draft_prompt_s_per_token``:
    the draft model's prompt seconds per generated token (its prompt mode's :meth:`Curve.row_seconds`
    × the prompt rows it reads per generated token): on a 2-core Xeon with AMX, where 8 requests' rows
    cost little more than one, leaving it out chose γ=1 at 8 concurrent chat requests, which ran
    0.91–0.94× speculation off."""
    if not step_seconds:
        return None
    curve = Curve("target", dict(step_seconds))
    draft_cost = draft_rows_cost(draft_step_seconds)
    table: dict[int, int] = {}
    for requests in range(1, max_requests + 1):
        speculating = not table or table[requests - 1]  # once it stops paying, more requests will not help
        table[requests] = batch_rate(curve, requests, alpha if speculating else None, draft_cost, gamma or max_gamma,
                                     BATCH_SPECULATION_MARGIN, draft_prompt_s_per_token)[1]
    return table


def batch_saving_per_token(step_seconds: dict[int, float], requests: int, alpha: float, gamma: int | None,
                           draft_step_seconds: dict[int, float] | None, max_gamma: int = 8,
                           draft_prompt_s_per_token: float = 0.0) -> float:
    """Forward seconds per committed token that speculating saves over plain decoding when
    ``requests`` requests share forwards, at the γ :func:`batch_gammas` would give them (0 where it
    does not pay, the draft's prompt passes counted as there): what a draft model's pass over a new
    request's prompt must be paid back from under load — less than a request alone saves, as
    verification rows are no longer free. (The saving itself leaves the prompt passes out: the pay-back
    test charges the request's own.)"""
    curve = Curve("target", dict(step_seconds))
    draft_cost = draft_rows_cost(draft_step_seconds)
    _, chosen = batch_rate(curve, requests, alpha, draft_cost, gamma or max_gamma, BATCH_SPECULATION_MARGIN,
                           draft_prompt_s_per_token)
    if not chosen:
        return 0.0
    return curve.cost(requests) / requests - 1.0 / speculation_rate(curve, requests, alpha, chosen, draft_cost)


def batch_speculation_limit(step_seconds: dict[int, float] | None, alpha: float, gamma: int | None,
                            draft_step_seconds: dict[int, float] | None, max_requests: int, max_gamma: int = 8) -> int | None:
    """The most concurrent requests at which speculation is still expected to beat plain decoding
    (:func:`batch_gammas` > 0; the server's ``--disable-speculation-above auto``); None when unmeasured."""
    table = batch_gammas(step_seconds, alpha, gamma, draft_step_seconds, max_requests, max_gamma)
    return None if table is None else sum(1 for g in table.values() if g)


def choose_mode_for_load(curves: dict[str, Curve], requests: int, alpha: float | None = None,
                         draft_step_seconds: dict[int, float] | None = None, max_gamma: int = 8) -> ModeChoice:
    """The candidate that serves ``requests`` concurrent requests with the most total tokens/s: their
    decoding stepped together (:func:`batch_rate`, speculating where it pays at that load) plus the
    prefill of :data:`PROMPT_TOKENS_PER_GENERATED` prompt tokens per generated token, each costing a
    long prefill's per-row seconds. A mode whose extra rows are cheap (fbgemm's int8 on VNNI)
    wins here even where another (our int4) decodes a single request faster."""
    draft_cost = draft_rows_cost(draft_step_seconds)
    rates, gammas = {}, {}
    for mode, curve in curves.items():
        decode_rate, gammas[mode] = batch_rate(curve, requests, alpha, draft_cost, max_gamma, BATCH_SPECULATION_MARGIN)
        rates[mode] = 1.0 / (1.0 / decode_rate + PROMPT_TOKENS_PER_GENERATED * curve.row_seconds())
    mode = max(curves, key=lambda m: rates[m])
    note = (f"expected tok/s: {requests} concurrent requests together (the server's --max-num-seqs), with "
            f"{PROMPT_TOKENS_PER_GENERATED:g} prompt token prefilled per generated token; γ at that load")
    return ModeChoice(mode, curves, rates, gammas, alpha, draft_cost(1), [note], requests)
