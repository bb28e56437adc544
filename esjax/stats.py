"""Confidence intervals of an evaluation over its goals (no SciPy needed).

``score_interval``: a Student-t interval of 100 × mean reward over the goals; ``wilson_interval``: the Wilson
score interval of the success rate (share of goals with reward 1.0), which stays inside [0, 1] and is not
degenerate at 0 successes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z975 = 1.959963984540054
#: t quantiles at 0.975 for 1..8 degrees of freedom (the series below is accurate to 2e-5 from 9 on)
_T975_SMALL = (12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851, 2.364624252,
               2.306004135)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (Cornish-Fisher series from 9 on)."""
    if df < 1:
        raise ValueError(f"t975: df must be >= 1, got {df}")
    if df <= len(_T975_SMALL):
        return _T975_SMALL[df - 1]
    z = Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def score_interval(rewards: Sequence[float]) -> tuple[float, float] | None:
    """95% t interval of the score (100 × mean reward) over goals; None with fewer than two goals."""
    n = len(rewards)
    if n < 2:
        return None
    mean = sum(rewards) / n
    sd = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return 100 * (mean - half), 100 * (mean + half)


def wilson_interval(successes: int, n: int) -> tuple[float, float] | None:
    """95% Wilson interval of a success rate (a share in [0, 1]); None when ``n`` is 0."""
    if n <= 0:
        return None
    p = successes / n
    z2 = Z975**2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z975 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends (no rounding residue)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def eval_intervals(rewards: Sequence[float]) -> dict[str, float]:
    """The interval fields of an ``eval`` record (score and success rate, 95%), empty with fewer than 2 goals."""
    rewards = [float(r) for r in rewards]
    score = score_interval(rewards)
    success = wilson_interval(sum(r == 1.0 for r in rewards), len(rewards))
    if score is None or success is None:
        return {}
    return {"score_ci_low": score[0], "score_ci_high": score[1],
            "success_ci_low": success[0], "success_ci_high": success[1]}
