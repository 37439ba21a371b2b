"""Adaptive γ: choose how many tokens to draft each round to maximise expected tokens per second.

With per-token acceptance probability α, drafting k tokens commits on average
``(1 - α^(k+1)) / (1 - α)`` tokens per target forward (Leviathan et al. 2023), and costs
``k·t_draft + t_verify(k)``. On GPUs ``t_verify`` is flat in k; on a CPU it grows, so we measure it per
k instead of assuming ``k·c + 1``. α, the draft cost per token and the verify cost per k are running
averages of this request's own steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def expected_tokens(alpha: float, k: int) -> float:
    """Expected committed tokens per target forward when drafting k tokens with acceptance α."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class GammaController:
    max_k: int
    alpha: float = 0.7  # optimistic prior: speculation gets tried before it is judged
    draft_s_per_token: float | None = None
    verify_s: dict[int, float] = field(default_factory=dict)  # k -> EMA seconds of a (k+1)-token forward
    smoothing: float = 0.2
    explore_every: int = 16  # while k=0 is chosen, still try k=1 this often so α keeps being measured
    _steps_at_zero: int = 0

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def update(self, proposed: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.verify_s[proposed] = self._ema(self.verify_s.get(proposed), verify_s)
        if proposed:
            # a round that stopped at the first rejection saw (accepted + 1) Bernoulli trials
            trials = min(accepted + 1, proposed)
            self.alpha = self._ema(self.alpha, accepted / trials)
            self.draft_s_per_token = self._ema(self.draft_s_per_token, draft_s / proposed)

    def _verify_cost(self, k: int) -> float:
        if k in self.verify_s:
            return self.verify_s[k]
        known = sorted(self.verify_s.items())
        if not known:
            return 1.0
        if len(known) == 1:  # assume a mild slope until measured
            k0, t0 = known[0]
            return t0 * (1.0 + 0.05 * (k - k0))
        (k0, t0), (k1, t1) = (known[0], known[-1]) if k > known[-1][0] or k < known[0][0] else _bracket(known, k)
        slope = (t1 - t0) / (k1 - k0) if k1 != k0 else 0.0
        return max(t0 + slope * (k - k0), 1e-6)

    def choose(self) -> int:
        if self.draft_s_per_token is None:
            return self.max_k  # nothing measured yet: draft fully once
        best_k, best_rate = 0, 1.0 / self._verify_cost(0)  # plain decoding is always an option
        for k in range(1, self.max_k + 1):
            rate = expected_tokens(self.alpha, k) / (k * self.draft_s_per_token + self._verify_cost(k))
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0:
            self._steps_at_zero += 1
            if self._steps_at_zero % self.explore_every == 0:
                return 1
        return best_k


def _bracket(known: list[tuple[int, float]], k: int) -> tuple[tuple[int, float], tuple[int, float]]:
    lower = max((p for p in known if p[0] < k), key=lambda p: p[0])
    upper = min((p for p in known if p[0] > k), key=lambda p: p[0])
    return lower, upper
