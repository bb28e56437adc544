"""Confidence intervals of an evaluation over its goals.

``score_interval``: a Student-t interval of 100 × mean reward over the goals; ``wilson_interval``: the Wilson
score interval of the success rate (share of goals with reward 1.0), which stays inside [0, 1] and is not
degenerate at 0 successes. Quantiles come from SciPy (a dependency of jax).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: ``scipy.stats.norm.ppf(0.975)`` as a literal (the same float; a test checks): SciPy's stats module is imported
#: only when a t quantile is needed, not by every process that imports the trainer (~0.6 s).
Z975 = 1.959963984540054


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    from scipy import stats

    if df < 1:
        raise ValueError(f"t975: df must be >= 1, got {df}")
    return float(stats.t.ppf(0.975, df))


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
