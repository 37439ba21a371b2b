"""Goodness-of-fit tests used to certify that speculative sampling is exact (no scipy needed).

Used by the unit tests of the verifier and by ``specdec verify``. The p-value is the upper tail of
the χ² distribution, Q((cells − 1)/2, X²/2), computed with the regularized incomplete gamma function
(series below a+1, Lentz continued fraction above; Numerical Recipes §6.2), accurate to ~1e-12.
"""

from __future__ import annotations

import math
from typing import Sequence


def _upper_regularized_gamma(a: float, x: float) -> float:
    """Q(a, x) = Γ(a, x) / Γ(a): series for x < a+1, continued fraction otherwise (Numerical Recipes)."""
    if x <= 0:
        return 1.0
    log_prefactor = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefactor))
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(log_prefactor) * h


def chi_square_pvalue(counts: Sequence[int], probs: Sequence[float], min_expected: float = 5.0) -> float:
    """Pearson χ² goodness-of-fit p-value of observed ``counts`` against category ``probs``.

    ``probs`` need not be normalised. Cells whose expected count is below ``min_expected`` are pooled
    into one cell (the usual validity condition of the χ² approximation). An observation in a cell of
    probability 0 is impossible under the hypothesis, so it returns 0.0 outright.
    """
    if len(counts) != len(probs):
        raise ValueError(f"{len(counts)} counts for {len(probs)} probabilities")
    if any(count > 0 and p <= 0 for count, p in zip(counts, probs)):
        return 0.0
    n = sum(counts)
    total_p = sum(probs)
    if n == 0 or total_p <= 0:
        return 1.0
    cells: list[tuple[float, float]] = []
    pooled_obs = pooled_exp = 0.0
    for count, p in zip(counts, probs):
        expected = n * p / total_p
        if expected < min_expected:
            pooled_obs += count
            pooled_exp += expected
        else:
            cells.append((count, expected))
    if pooled_exp > 0:
        if pooled_exp < min_expected and cells:  # still too small: fold into the smallest cell
            smallest = min(range(len(cells)), key=lambda i: cells[i][1])
            obs, exp = cells[smallest]
            cells[smallest] = (obs + pooled_obs, exp + pooled_exp)
        else:
            cells.append((pooled_obs, pooled_exp))
    if len(cells) < 2:
        return 1.0
    statistic = sum((obs - exp) ** 2 / exp for obs, exp in cells)
    return _upper_regularized_gamma((len(cells) - 1) / 2, statistic / 2)
