"""How much requests that share forwards may draft: the server's and the offline batch API's policy.

Sharing a forward, drafts verified together cost rows where plain decoding costs one each, so the
more requests run at once, the less speculating pays (cost_model.batch_gammas: γ per number of
requests from the measured step costs and the traffic's α; ``--disable-speculation-above N`` by
hand). :class:`BatchPolicy` holds that choice; :class:`RequestGate` is one request's side of it.

The server reads it against its load. Why not just the number of active requests at this instant:
under a steady load of closed-loop clients a request often starts while it is momentarily alone (its
neighbour's client is between requests). It then speculates, its draft model pays a pass over the
whole prompt, and the next arrival switches it off again: measured at 2/4/8 concurrent clients on
the default pair, speculation-on requests ran at 0.96/0.89/0.93× plain
(benchmarks/results/2026-11-25/serve-load-auto.md). So the server reads the larger of the count now
and a time-weighted average of recent counts (:class:`LoadAverage`, active plus waiting requests,
time constant a few requests long): one user's requests back to back stay at ≤ 1 and speculate; two
users' average ~2 and do not, even in the gaps between their requests. The offline batch API
(:func:`specdec.batch.generate_batch`) knows its count exactly.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Hashable

from specdec.adaptive import TRIALS_TO_JUDGE
from specdec.cost_model import PROMPT_TOKENS_PER_GENERATED
from specdec.errors import SpecdecError
from specdec.forward_costs import ForwardCosts, at_most_larger

if TYPE_CHECKING:
    from specdec.api import LoadedModel
    from specdec.config import SpecConfig
    from specdec.stats import Round, Stats

#: seconds over which the load average forgets (a few requests' length on a CPU)
LOAD_TIME_CONSTANT_S = 5.0
#: acceptance trials the traffic meter's prior α counts as: about one request's (64 tokens at a τ of ~2).
#: Worth 2 (a request's own controller's prior), one 8-token request at α 0.93 (a load benchmark's warm-up)
#: set the whole server's α, and its table let 8 concurrent chat requests draft at γ ≤ 3: 0.85x plain.
TRAFFIC_PRIOR_TRIALS = 32.0
#: a draft model's batched forward ÷ its curve where no forward of that many requests was measured yet
#: (ForwardCosts replaces it per size once one is): its step after a target forward, with the bonus
#: token and the last accepted one to feed (two rows a request), in caches of its own per request.
#: Measured in the scheduler (int4-all 0.5B draft after an int8 1.5B target, AMX Xeon, γ=1, session 50):
#: 1 request 1.44, 5-8 requests 1.9-2.3; session 35: 1.5-1.64 at 1-8. At the curve alone (1.0) the table
#: allows γ=1 at 8 concurrent requests from α 0.6, and 8 chat requests at γ=1 (α 0.68) ran 0.89x plain.
DRAFT_FORWARD_PRIOR = 1.8


class LoadAverage:
    """Time-weighted exponential average of a count that changes at discrete moments (requests in
    the server): each value counts for as long as it was held. Thread-safe (the event loop moves the
    count, the model thread asks)."""

    def __init__(self, time_constant_s: float = LOAD_TIME_CONSTANT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.time_constant_s = time_constant_s
        self.clock = clock
        self._lock = threading.Lock()
        self._count = 0
        self._average = 0.0
        self._since = clock()

    def _advance(self, now: float) -> None:
        held = max(0.0, now - self._since)
        weight = math.exp(-held / self.time_constant_s)
        self._average = self._average * weight + self._count * (1.0 - weight)
        self._since = now

    def set(self, count: int) -> None:
        """The count changed to ``count`` now."""
        with self._lock:
            self._advance(self.clock())
            self._count = count

    def value(self) -> float:
        with self._lock:
            self._advance(self.clock())
            return self._average


def requests_now(active: int, load: LoadAverage) -> int:
    """The requests a new one shares forwards with, itself included: the larger of those active now
    and the recent average (rounded: 1.4 is one user with some overlap, 1.6 is two)."""
    return max(1, active, math.floor(load.value() + 0.5))


def speculation_cap(limit: int | None, gammas: dict[int, int] | None, requests: int,
                    sharing: int | None = None) -> int | None:
    """The most tokens a request may draft now: 0 none, None no cap. Over ``limit`` requests sharing
    forwards (the server: :func:`requests_now`; None: never) nothing is drafted; else, sharing forwards
    with others, ``gammas`` (γ per number of requests from a prior α, cost_model.batch_gammas) says
    how much — or, with no table, ``sharing`` (the configured γ maximum; None: no cap). That cap
    leaves chains as they are and holds a token tree to a chain's rows: a tree sizes itself on one
    sequence's verify costs, where extra rows are nearly free on a flat curve, but in a shared forward
    every request's extra rows add up (under a fixed limit, HumanEval trees of 8 nodes ran at
    0.82–0.88× chains of 4 with 4–8 requests sharing; session 42)."""
    if limit is not None and requests > limit:
        return 0
    if requests == 1:  # alone, the request's own γ (its controller knows its α)
        return None
    if gammas is None:
        return sharing
    return gammas.get(requests, 0)


class RequestGate:
    """One request's answer to the engine's ``speculate`` question, asked before each round
    (engine.generate_steps): the policy's cap for the load now, except that

    - once the cap said none, it stays none: resuming when the load drops would first make a draft
      model catch up on everything generated meanwhile (a prompt pass of the draft), mostly for the
      few tokens a request near its end has left (the load test's 8-request level ran at 0.86x plain
      without this rule). A lower or higher cap above 0 costs nothing to change;
    - while another request waits for its prompt pass (``prompt_pending``: Batcher.prompt_pending),
      this round drafts nothing, and the next may again (its draft model catches up one token)."""

    def __init__(self, cap: Callable[[], int | None], prompt_pending: Callable[[], bool] | None = None) -> None:
        self.cap = cap
        self.prompt_pending = prompt_pending
        self.speculating = True

    def __call__(self) -> int | None:
        if not self.speculating:
            return 0
        cap = self.cap()
        self.speculating = cap != 0
        if cap != 0 and self.prompt_pending is not None and self.prompt_pending():
            return 0
        return cap


class AcceptanceMeter:
    """α of the server's own traffic, from its requests' rounds as they run: accepted tokens over
    acceptance trials (Round.chain_trials: a tree round as a chain of its first choices), as running
    sums that forget older rounds (by ``decay`` every TRAFFIC_PRIOR_TRIALS trials, about one request's).
    Starts from ``prior`` worth of TRAFFIC_PRIOR_TRIALS trials: the first request moves it about
    halfway. The γ per number of requests under load (:class:`GammaTable`) is computed with it: the
    prior α 0.7 is a code drafter's, chat traffic was measured far lower, and speculating at it under
    load lost throughput. Fed per round, not per finished request: a fresh server's first wave of
    concurrent requests otherwise drafted at the prior's γ to its end (0.94x off at 8 chat requests)."""

    def __init__(self, prior: float = 0.7, decay: float = 0.8) -> None:
        self.decay = decay
        self._lock = threading.Lock()
        self._accepted, self._trials = TRAFFIC_PRIOR_TRIALS * prior, TRAFFIC_PRIOR_TRIALS
        self._observed = 0  # acceptance trials seen in all (not decayed)

    def observe(self, rounds: list[Round]) -> None:
        counted = [r.chain_trials() for r in rounds if r.drafted]  # trees as chains of their first choices
        accepted, trials = sum(a for a, _ in counted), sum(t for _, t in counted)
        if not trials:
            return
        kept = self.decay ** (trials / TRAFFIC_PRIOR_TRIALS)  # the same forgetting however rounds are grouped
        with self._lock:
            self._accepted = kept * self._accepted + accepted
            self._trials = kept * self._trials + trials
            self._observed += trials

    @property
    def measured(self) -> bool:
        """Whether α rests on traffic (enough trials to judge a drafter) rather than on the prior: a
        request's own controller plans optimistically until then (specdec.adaptive.OPTIMISTIC_ALPHA)."""
        with self._lock:
            return self._observed >= TRIALS_TO_JUDGE

    @property
    def alpha(self) -> float:
        with self._lock:
            return self._accepted / self._trials


class PromptShare:
    """Prompt tokens a draft model reads per generated token on this traffic, from finished requests
    (running sums that forget older ones, ``decay`` per request): what a new request's draft prompt
    pass costs each committed token under load (cost_model.batch_rate). Starts from ``prior`` worth of
    ``PRIOR_TOKENS`` generated tokens. Why measured: chat requests bring ~1.4 prompt tokens per
    generated one, HumanEval completions ~2.5 (the draft reads at most ``window`` of them: its context
    window, 0 = all); with the fixed prior of 1, speculation at 8 concurrent HumanEval requests ran at
    0.95x off on a 2-core AMX Xeon (session 35)."""

    PRIOR_TOKENS = 64.0

    def __init__(self, prior: float = PROMPT_TOKENS_PER_GENERATED, window: int = 0, decay: float = 0.8) -> None:
        self.window = window
        self.decay = decay
        self._lock = threading.Lock()
        self._prompt, self._generated = self.PRIOR_TOKENS * prior, self.PRIOR_TOKENS

    def observe(self, prompt_tokens: int, generated_tokens: int) -> None:
        if generated_tokens <= 0:
            return
        read = min(prompt_tokens, self.window) if self.window else prompt_tokens
        with self._lock:
            self._prompt = self.decay * self._prompt + read
            self._generated = self.decay * self._generated + generated_tokens

    @property
    def value(self) -> float:
        with self._lock:
            return self._prompt / self._generated


class GammaTable:
    """γ per number of concurrent requests for an α (cost_model.batch_gammas over the curves), recomputed
    when α moves by a step of 0.05 or the measured forward costs move (``version``: a value that
    changes with them, :func:`measured_gamma_table`); and what speculating saves per token at a load
    (cost_model.batch_saving_per_token: a new request's draft prompt pass must repay it)."""

    def __init__(self, gammas_for: Callable[[float], dict[int, int] | None],
                 saving_for: Callable[[float, int], float] | None = None,
                 version: Callable[[], Hashable] = lambda: None) -> None:
        self.gammas_for = gammas_for
        self.saving_for = saving_for
        self.version = version
        self._cache: dict[tuple[float, Hashable], dict[int, int] | None] = {}

    @staticmethod
    def _key(alpha: float) -> float:
        return round(min(max(alpha, 0.0), 0.99) * 20) / 20

    def for_alpha(self, alpha: float) -> dict[int, int] | None:
        key = (self._key(alpha), self.version())
        if key not in self._cache:
            if len(self._cache) > 256:  # costs keep moving a little: forget old tables
                self._cache.clear()
            self._cache[key] = self.gammas_for(key[0])
        return self._cache[key]

    def saving(self, alpha: float, requests: int) -> float | None:
        """Forward seconds per token speculating saves with ``requests`` sharing forwards (None: unknown)."""
        return None if self.saving_for is None else self.saving_for(self._key(alpha), requests)


@dataclass
class BatchPolicy:
    """How much a request may draft while ``requests`` share forwards: ``limit`` requests at most
    (``--disable-speculation-above N``; None: never switched off) or, under ``auto``, ``table``'s γ per
    number of requests at the α ``acceptance`` measures on the traffic (the limit is then where γ
    reaches 0)."""

    limit: int | None = None
    table: GammaTable | None = None
    #: the table also says above how many requests nothing is drafted (``auto``); False: ``limit`` (the
    #: user's number, or never) says that, and the table only sizes γ=auto drafts below it (at least 1)
    table_limits: bool = True
    #: with no table, what a request sharing forwards may draft (speculation_cap's ``sharing``)
    sharing_cap: int | None = None
    acceptance: AcceptanceMeter = field(default_factory=AcceptanceMeter)
    #: what the scheduler's forwards measured (the table's curves are rescaled by it; fed by its owner)
    costs: ForwardCosts = field(default_factory=ForwardCosts)
    #: prompt tokens the draft reads per generated token on this traffic (the table charges them)
    prompt_share: PromptShare = field(default_factory=PromptShare)

    @classmethod
    def from_setting(cls, setting: int | str | None, spec: SpecConfig, target: LoadedModel, draft: LoadedModel | None,
                     max_requests: int) -> "BatchPolicy":
        """``--disable-speculation-above`` / ``disable_speculation_above``: ``"auto"`` — the table from
        the loaded models' measured costs (:func:`measured_gamma_table`; never switched off where those
        are unmeasured) —, a number of requests, or ``"never"`` (None too)."""
        if setting in ("auto", "never", None):
            limit = None
        elif isinstance(setting, int) and not isinstance(setting, bool) and setting >= 0:
            limit = setting
        else:
            raise SpecdecError(f"disable_speculation_above must be a number of requests >= 0, 'auto' or 'never', "
                               f"got {setting!r}")
        # with no table, trees sharing forwards verify a chain's rows where the target's rows are priced
        # (measured CPU curves); unmeasured (CUDA, float weights) rows count as free, as for one request
        sharing = spec.max_speculative_tokens if target.backend.step_seconds else None
        if setting != "auto" and spec.num_speculative_tokens != "auto":
            return cls(limit, sharing_cap=sharing)
        # under a fixed limit, γ=auto sharing forwards: each request's controller sees the shared forward's
        # time as its own verify cost, where its extra rows look nearly free, and drafts too much (at 4
        # concurrent requests 1.3-1.4x γ=4's tokens, 0.90x its tokens/s: session 49); the table prices every
        # request's rows
        costs, share = ForwardCosts(), PromptShare(window=spec.draft_context_window)
        return cls(limit, measured_gamma_table(spec, target, draft, max_requests, costs, share), sharing_cap=sharing,
                   costs=costs, prompt_share=share, table_limits=setting == "auto")

    def cap(self, requests: int) -> int | None:
        """The most tokens a request may draft with ``requests`` sharing forwards (0: none, None: no cap)."""
        limit, gammas = self.limit, None
        if self.table is not None:
            gammas = self.table.for_alpha(self.acceptance.alpha)
            if self.table_limits:  # at least 1: alone, a request keeps its own γ even where the table's is 0
                # (the traffic's α says speculation does not pay; this request's own controller, or the γ it
                # asked for, decides: a limit of 0 had switched off every lone request, explicit γ too)
                limit = None if gammas is None else max(1, sum(1 for g in gammas.values() if g))
            elif gammas:  # the user's limit says when to stop; below it at least one token (past the table: its last)
                gammas = {requests: max(1, gammas.get(requests, gammas[max(gammas)]))}
        return speculation_cap(limit, gammas, requests, self.sharing_cap)

    def saving(self, requests: int) -> float | None:
        """Seconds per token speculating saves with ``requests`` sharing forwards, for a new request's
        pay-back test (engine.generate_steps): None when it is alone (its own γ controller knows
        better) or the costs are unmeasured."""
        if self.table is None or not self.table_limits or requests == 1:  # under a user's limit a request drafts
            return None
        return self.table.saving(self.acceptance.alpha, requests)

    def observe_rounds(self, rounds: list[Round]) -> None:
        """A running request's latest rounds (StreamChunk.rounds): the traffic's α."""
        self.acceptance.observe(rounds)

    def observe_finished(self, stats: Stats) -> None:
        """A finished request: its prompt and output lengths (its rounds were observed as they ran)."""
        self.prompt_share.observe(stats.prompt_tokens, stats.generated_tokens)

    def measured_alpha(self) -> float | None:
        """The traffic's α once measured (a request's γ controller starts from it), else None."""
        return self.acceptance.alpha if self.acceptance.measured else None


def measured_gamma_table(spec: SpecConfig, target: LoadedModel, draft: LoadedModel | None,
                         max_requests: int, costs: ForwardCosts | None = None,
                         prompt_share: PromptShare | None = None) -> GammaTable | None:
    """``--disable-speculation-above auto``: :func:`specdec.cost_model.batch_gammas` for the
    method over the target's and draft's measured curves, at the α the traffic shows (a request
    that overrides the method is held to the same γ per number of requests); None when the
    target's costs are unmeasured (float weights, CUDA: nothing is switched off). The curves are
    rescaled by what ``costs`` measured of the batched forwards at each size, once it has
    (specdec.forward_costs: a batch of N requests costs more than one sequence's N-token chunk), and
    the draft's prompt passes are charged at the traffic's ``prompt_share``."""
    from specdec.cost_model import batch_gammas, batch_saving_per_token
    from specdec.drafters.registry import needs_draft_model
    from specdec.step_calibration import batch_curve, prompt_row_seconds, rescaled
    from specdec.step_costs import draft_curve

    if spec.method is None or not target.backend.step_seconds:
        return None
    target_curve = batch_curve(target.backend)  # the probe's, up to 32 rows, rescaled to the loaded model
    model_drafts = needs_draft_model(spec.method)
    drafting, prompt_row_s = None, 0.0
    if model_drafts and draft is not None and draft.backend.step_seconds:
        drafting = rescaled(draft_curve(draft.config, draft.backend.mode, spec.draft_vocab_size or None)
                            or draft.backend.step_seconds, draft.backend.step_ratios)
        prompt_row_s = prompt_row_seconds(draft.backend)  # the draft's pass over each new prompt
    gamma = spec.num_speculative_tokens if isinstance(spec.num_speculative_tokens, int) else None
    costs = costs if costs is not None else ForwardCosts()
    share = prompt_share if prompt_share is not None else PromptShare()

    latest: list[tuple[int, tuple[dict[int, float], dict[int, float] | None]]] = [(-1, (target_curve, drafting))]

    def curves() -> tuple[dict[int, float], dict[int, float] | None]:
        """The target's curve by rows and the draft model's by requests, as measured so far: rebuilt once
        per recorded forward (every speculating request asks before each round; a rebuild is ~0.2 ms)."""
        observed = costs.observed
        seen, built = latest[0]
        if seen != observed:
            measured_target = at_most_larger(rescaled(target_curve, costs.ratios(target.backend, target_curve, "rows")))
            measured_draft = drafting if drafting is None or draft is None else at_most_larger(rescaled(drafting, {
                **{requests: DRAFT_FORWARD_PRIOR for requests in drafting}, **costs.ratios(draft.backend, drafting, "requests")}))
            built = measured_target, measured_draft
            latest[0] = observed, built  # one assignment: another thread reads the old pair or the new
        return built

    def version() -> Hashable:  # the curves to a tenth of their measured ratios, the prompt share to a quarter
        target_now, drafting_now = curves()
        return tuple(round(math.log(now / target_curve[size]) * 10) for size, now in sorted(target_now.items())) + tuple(
            round(math.log(now / drafting[size]) * 10) for size, now in sorted((drafting_now or {}).items())) + (
            round(share.value * 4),)

    def gammas_for(alpha: float) -> dict[int, int] | None:
        target_now, drafting_now = curves()
        return batch_gammas(target_now, alpha, gamma, drafting_now, max_requests, spec.max_speculative_tokens,
                            prompt_row_s * share.value)

    def saving_for(alpha: float, requests: int) -> float:
        target_now, drafting_now = curves()
        return batch_saving_per_token(target_now, requests, alpha, gamma, drafting_now, spec.max_speculative_tokens,
                                      prompt_row_s * share.value)

    return GammaTable(gammas_for, saving_for, version)
