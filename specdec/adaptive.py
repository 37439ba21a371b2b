"""Adaptive γ: choose how many tokens to draft each round to maximise expected tokens per second.

With per-token acceptance probability α, drafting k tokens commits on average
``(1 - α^(k+1)) / (1 - α)`` tokens per target forward (Leviathan et al. 2023), and costs
``k·t_draft + t_verify(k)``. On GPUs ``t_verify`` is flat in k; on a CPU it grows, so we measure it per
k instead of assuming ``k·c + 1``. α, the draft cost per token and the verify cost per k are running
averages of this request's own steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.stats import acceptance_trials
from specdec.tree import ranked_nodes


def expected_tokens(alpha: float, k: int) -> float:
    """Expected committed tokens per target forward when drafting k tokens with acceptance α."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


#: a prior α counts as this many acceptance trials, so the first measured rounds move it quickly
PRIOR_TRIALS = 2.0

#: until a request has seen TRIALS_TO_JUDGE acceptance trials of its own, γ is planned as if α were at
#: least OPTIMISTIC_ALPHA (unless the prior came from measured traffic): the question at the start is
#: not "does drafting pay at a typical α" but "is it worth finding out" — a few rounds answer it. With
#: the prior alone (0.7) and this machine's measured costs (int4 1.5B target, whole-vocabulary 0.5B
#: draft: 14.7 ms a draft step), γ=auto never drafted at all — on HumanEval too, where the pair's α
#: is 0.88 and γ=4 ran 1.11–1.40× plain (Zen 4 EPYC). Measured after, end to end × plain over 6
#: prompts per group (three runs): HumanEval 1.07–1.33 (was 1.00), GSM8K 1.07–1.32 (1.00), MT-Bench
#: 0.92–1.06 (1.00): a drafter that turns out worse costs its prompt pass and a few rounds.
OPTIMISTIC_ALPHA = 0.9
TRIALS_TO_JUDGE = 6


def ema(old: float | None, new: float, smoothing: float) -> float:
    """Exponential moving average; the first value is taken as it is."""
    return new if old is None else (1 - smoothing) * old + smoothing * new


@dataclass
class VerifyCosts:
    """EMA seconds of a verification forward per number of drafted tokens k (a (k+1)-token chunk).

    A k not measured yet is taken from the nearest measured k (flat), never extrapolated below it,
    so a longer draft is not assumed dearer than seen (it gets tried, then measured) and plain
    decoding does not look cheaper than it has been seen to be."""

    seconds: dict[int, float] = field(default_factory=dict)
    smoothing: float = 0.1

    @classmethod
    def from_measured(cls, verify_seconds: dict[int, float] | None) -> "VerifyCosts":
        """Costs starting from this machine's measured forward seconds per chunk of T tokens
        (``Backend.step_seconds``: k drafted tokens are a chunk of k + 1), or from nothing."""
        return cls({t - 1: s for t, s in (verify_seconds or {}).items() if t >= 1})

    def update(self, k: int, seconds: float | None) -> None:
        """A verification of k drafted tokens took ``seconds`` (None: not timed — nothing learnt)."""
        if seconds is not None:
            self.seconds[k] = ema(self.seconds.get(k), seconds, self.smoothing)

    def cost(self, k: int) -> float:
        if k in self.seconds:
            return self.seconds[k]
        known = sorted(self.seconds.items())
        if not known:
            return 1.0
        if k < known[0][0] or k > known[-1][0] or len(known) == 1:  # outside what was measured: flat
            return min(known, key=lambda p: abs(p[0] - k))[1]
        (k0, t0), (k1, t1) = _bracket(known, k)
        return t0 + (t1 - t0) * (k - k0) / (k1 - k0)

    def best_length(self, prefix_accept: list[float], at_least: int = 0) -> int:
        """How many of a draft's tokens to verify, given P(its first j tokens are all accepted) for
        j = 1..k (a drafter's estimates, non-increasing): the length with the most expected committed
        tokens per second of verification. On a GPU (flat cost) that keeps every token; on a CPU,
        where each verified token costs a fifth of a step in int4, unlikely tails are cut.
        ``at_least``: the first that many are verified whatever they are worth (a sampled chain that
        alternatives extend, :mod:`specdec.alternatives`)."""
        expected = 1.0 + sum(prefix_accept[:at_least])
        best, best_rate = at_least, expected / self.cost(at_least)
        for length, probability in enumerate(prefix_accept[at_least:], start=at_least + 1):
            expected += probability
            rate = expected / self.cost(length)
            if rate > best_rate:
                best, best_rate = length, rate
        return best

    def best_tree(self, parents: list[int], estimates: list[float], max_nodes: int) -> list[int]:
        """Which nodes of a token tree to verify (ascending, a tree): the likeliest first (EAGLE-2's
        reranking, :func:`specdec.tree.ranked_nodes`), as many as :meth:`best_length` finds worth
        their verify cost — expected committed tokens are 1 + the sum of the nodes' path
        probabilities, whatever the tree's shape — and at most ``max_nodes``."""
        ranked = ranked_nodes(parents, estimates)[:max_nodes]
        return sorted(ranked[: self.best_length([estimates[node] for node in ranked])])


@dataclass
class GammaController:
    """Running estimates of α, draft seconds per token and verify seconds per k; picks the k with
    the highest expected tokens per second, k = 0 (plain decoding) included.

    Two biases this avoids (both made ``auto`` lose to every fixed γ before):

    * **catch-up cost**: after plain steps a model drafter must first feed the tokens it missed, so
      its next round's time is not a per-token cost — those rounds do not update the draft cost. The
      first round is one too: a draft model prefills the whole prompt in it (counting it made one
      draft token look like a second of work, so ``auto`` fell back to plain decoding for good);
    * **unmeasured k**: a verify cost not measured yet is taken from the nearest measured k (flat),
      never extrapolated below it, so plain decoding does not look cheaper than it has been seen to be.
    """

    max_k: int
    alpha: float = 0.7  # optimistic prior: speculation gets tried before it is judged
    draft_s_per_token: float | None = None
    verify: VerifyCosts = field(default_factory=VerifyCosts)
    smoothing: float = 0.1
    #: while k=0 is chosen, still try k=1 after this many steps so α keeps being measured; the wait
    #: doubles after every exploration that did not change the choice (up to max_explore_every)
    explore_every: int = 8
    max_explore_every: int = 256
    _steps_at_zero: int = 0
    _explore_wait: int = 0
    _accepted: float = PRIOR_TRIALS * 0.7  # running sums (EMA) of accepted tokens and of acceptance
    _trials: float = PRIOR_TRIALS  # trials (acceptance_trials); their ratio is α
    #: plan with OPTIMISTIC_ALPHA until this request measured TRIALS_TO_JUDGE trials (False: the prior
    #: is itself a measurement, e.g. a server's traffic)
    optimistic: bool = True
    _trials_seen: int = 0  # acceptance trials this request has measured (not smoothed)
    _last_k: int = 0  # the request starts like a catch-up: the drafter has not seen the prompt yet

    @classmethod
    def from_measured(cls, max_k: int, verify_seconds: dict[int, float] | None,
                      draft_seconds: float | None, alpha: float | None = None) -> "GammaController":
        """A controller that starts from this machine's measured costs (specdec.step_costs:
        ``verify_seconds`` maps a chunk of T tokens to its forward seconds, ``draft_seconds`` is one
        draft token) instead of from nothing. Without them, the first rounds draft ``max_k`` tokens and
        take every unmeasured chunk as costing what the longest one did — on a CPU, where a 9-token
        chunk costs ~3 single steps, the first dozen rounds of a request paid for that. The
        running averages replace the prior as rounds are measured."""
        controller = cls(max_k, verify=VerifyCosts.from_measured(verify_seconds))
        controller.draft_s_per_token = draft_seconds
        if alpha is not None:  # a prior from this drafter's earlier requests (a server's traffic)
            controller.alpha, controller.optimistic = alpha, False
            controller._accepted, controller._trials = PRIOR_TRIALS * alpha, PRIOR_TRIALS
        return controller

    def _ema(self, old: float | None, new: float) -> float:
        return ema(old, new, self.smoothing)

    def update(self, proposed: int, accepted: int, draft_s: float | None, verify_s: float | None) -> None:
        """A round that drafted ``proposed`` tokens (one model step each) and had ``accepted`` of
        them accepted; ``verify_s`` None: its verification was not a chain of ``proposed`` (or not
        timed); ``draft_s`` None: not timed (α is still learnt)."""
        if verify_s is not None:
            self.verify.update(proposed, verify_s)
        if proposed and accepted == proposed:
            self._explore_wait = 0  # the draft was right: stop backing off exploration
        if proposed:
            trials = acceptance_trials(proposed, accepted)
            self._trials_seen += trials
            self._accepted = self._ema(self._accepted, accepted)
            self._trials = self._ema(self._trials, trials)
            self.alpha = self._accepted / self._trials
            if self._last_k != 0 and draft_s is not None:  # not a catch-up (or prefill) round
                self.draft_s_per_token = self._ema(self.draft_s_per_token, draft_s / proposed)
        self._last_k = proposed

    def update_tree(self, depth: int, accepted: int, nodes: int, draft_s: float | None, verify_s: float | None) -> None:
        """A token tree a model grew level by level (one draft step per level): to α and the draft
        cost a chain of its depth, with its accepted path; to the verify costs a chunk of its nodes."""
        self.update(depth, accepted, draft_s, None)
        self.verify.update(nodes, verify_s)

    def update_free_round(self, proposed: int, verify_s: float | None) -> None:
        """A round whose draft cost no model step and whose length the cost model chose (a draft
        with ``prefix_accept``: suffix tables): it says nothing about the draft model's α or cost,
        only about verification; the next model round catches up on the tokens it committed."""
        self.verify.update(proposed, verify_s)
        self._last_k = 0

    @property
    def planning_alpha(self) -> float:
        """The α choices are made with: the running estimate, or at least OPTIMISTIC_ALPHA while
        this request has not measured enough to judge its drafter (see TRIALS_TO_JUDGE)."""
        if self.optimistic and self._trials_seen < TRIALS_TO_JUDGE:
            return max(self.alpha, OPTIMISTIC_ALPHA)
        return self.alpha

    def expected_rate(self, k: int) -> float:
        """Expected committed tokens per second when drafting k tokens this round."""
        draft = k * (self.draft_s_per_token or 0.0)
        return expected_tokens(self.planning_alpha, k) / (draft + self.verify.cost(k))

    def saving_per_token(self) -> float | None:
        """Seconds per committed token drafting at the best γ saves over plain decoding, as far as
        the current estimates say (0 when drafting does not pay); None while the draft's step or the
        verification cost is unmeasured — unknown, which the first rounds measure, is not "no saving"."""
        if self.draft_s_per_token is None or not self.verify.seconds:
            return None
        best = max(self.expected_rate(k) for k in range(1, self.max_k + 1)) if self.max_k else 0.0
        plain = self.expected_rate(0)
        return max(0.0, 1.0 / plain - 1.0 / best) if best > plain > 0 else 0.0

    def choose(self) -> int:
        if self.draft_s_per_token is None:
            # nothing measured yet: draft fully once — or, when verification costs are known,
            # draft one token: the cheapest round that measures the draft's step
            return min(1, self.max_k) if self.verify.seconds else self.max_k
        best_k = max(range(self.max_k + 1), key=self.expected_rate)
        if best_k == 0:
            self._explore_wait = self._explore_wait or self.explore_every
            self._steps_at_zero += 1
            if self._steps_at_zero >= self._explore_wait:
                self._steps_at_zero = 0
                self._explore_wait = min(2 * self._explore_wait, self.max_explore_every)
                return 1
        else:
            self._steps_at_zero = self._explore_wait = 0
        return best_k


def _bracket(known: list[tuple[int, float]], k: int) -> tuple[tuple[int, float], tuple[int, float]]:
    lower = max((p for p in known if p[0] < k), key=lambda p: p[0])
    upper = min((p for p in known if p[0] > k), key=lambda p: p[0])
    return lower, upper
