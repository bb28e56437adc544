"""The statistics of runs, in one place: a run's intervals over its goals, and the paired comparison of runs over
seeds that a study of schedules makes.

Over the goals of one evaluation (written into every ``eval`` record): ``score_interval``, a Student-t interval of
100 × mean reward; ``wilson_interval``, the Wilson score interval of the success rate (share of goals with reward
1.0), which stays inside [0, 1] and is not degenerate at 0 successes; ``eval_intervals``, both as record fields.

Over seeds (a schedule against a reference, paired by seed: experiments/ and its study report use these):
``mean_interval``, the t interval of a mean; ``paired_test``, the paired t test of Δ = 0 and the two one-sided
tests (TOST) of equivalence within a margin m; ``holm``, Holm–Bonferroni adjustment over a family of tests;
``verdict``, the one label a comparison gets; ``fieller_ratio``, the ratio of two paired means with Fieller's
interval (the share of a reference's gain a schedule keeps, with the uncertainty of both); ``tost_power``,
``seeds_needed`` and ``seeds_normal``, the exact and the normal-approximation seed counts of a TOST; ``pooled_sd``
and ``sd_upper``, a pooled SD and an upper confidence bound of an SD. Quantiles come from SciPy (a dependency of
jax), imported only when one is needed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

#: ``scipy.stats.norm.ppf(0.975)`` as a literal (the same float; a test checks): SciPy's stats module is imported
#: only when a t quantile is needed, not by every process that imports the trainer (~0.6 s).
Z975 = 1.959963984540054

#: The labels of :func:`verdict`, in the order its rule checks them.
VERDICTS = ("equivalent within m", "worse", "better", "inconclusive")


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    from scipy import stats

    if df < 1:
        raise ValueError(f"t975: df must be >= 1, got {df}")
    return float(stats.t.ppf(0.975, df))


# ---------------------------------------------------------------------------------------------------------
# Intervals: of a mean, and of an evaluation's score and success rate over its goals
# ---------------------------------------------------------------------------------------------------------


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the two-sided ``level`` t interval of the mean of ``values`` (NaN bounds with fewer than
    two values, all NaN with none)."""
    from scipy import stats

    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def score_interval(rewards: Sequence[float]) -> tuple[float, float] | None:
    """95% t interval of the score (100 × mean reward) over goals; None with fewer than two goals."""
    if len(rewards) < 2:
        return None
    _, low, high = mean_interval(rewards)
    return 100 * low, 100 * high


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


def full_marks(reward: float) -> bool:
    """An episode's success by default (:meth:`esjax.task.Task.is_success`): the full reward, WebShop's 1.0."""
    return reward == 1.0


def eval_intervals(rewards: Sequence[float], is_success: Callable[[float], bool] = full_marks) -> dict[str, float]:
    """The interval fields of an ``eval`` record (score and success rate, 95%; an episode succeeds when
    ``is_success(reward)``, the task's rule), empty with fewer than 2 goals."""
    rewards = [float(r) for r in rewards]
    score = score_interval(rewards)
    success = wilson_interval(sum(map(is_success, rewards)), len(rewards))
    if score is None or success is None:
        return {}
    return {"score_ci_low": score[0], "score_ci_high": score[1],
            "success_ci_low": success[0], "success_ci_high": success[1]}


# ---------------------------------------------------------------------------------------------------------
# Runs paired over seeds: difference, equivalence, multiplicity
# ---------------------------------------------------------------------------------------------------------


def paired_test(diffs: Sequence[float], margin: float, alpha: float = 0.05) -> dict:
    """Paired t statistics of the differences Δᵢ: n, mean, sd (paired SD), the 95% and (1 − 2α) t intervals,
    the two-sided p of Δ = 0 (``p_diff``) and the TOST p-values at margin m (``p_lower``: H₀ Δ ≤ −m,
    ``p_upper``: H₀ Δ ≥ +m, ``p_tost`` = their max; p_tost < α exactly when the (1 − 2α) interval lies inside
    (−m, +m)). With fewer than 2 differences every test value is NaN; with a zero SD the tests are decided exactly
    (a constant Δ is different from 0 unless it is 0, equivalent iff |Δ| < m)."""
    from scipy import stats

    x = np.asarray(diffs, np.float64)
    n = len(x)
    nan = math.nan
    out = {"n": n, "mean": float(x.mean()) if n else nan, "sd": nan, "se": nan, "low95": nan, "high95": nan,
           "low90": nan, "high90": nan, "p_diff": nan, "p_lower": nan, "p_upper": nan, "p_tost": nan,
           "margin": float(margin), "alpha": float(alpha)}
    if n < 2:
        return out
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    se, df = sd / math.sqrt(n), n - 1
    q95, q90 = float(stats.t.ppf(0.975, df)), float(stats.t.ppf(1 - alpha, df))
    out.update(sd=sd, se=se, low95=mean - q95 * se, high95=mean + q95 * se, low90=mean - q90 * se,
               high90=mean + q90 * se)
    if se == 0.0:
        out["p_diff"] = 1.0 if mean == 0.0 else 0.0
        out["p_lower"] = 0.0 if mean > -margin else 1.0
        out["p_upper"] = 0.0 if mean < margin else 1.0
    else:
        out["p_diff"] = float(2 * stats.t.sf(abs(mean) / se, df))
        out["p_lower"] = float(stats.t.sf((mean + margin) / se, df))
        out["p_upper"] = float(stats.t.cdf((mean - margin) / se, df))
    out["p_tost"] = max(out["p_lower"], out["p_upper"])
    return out


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (step-down, monotone, capped at 1), in the input order. NaN entries
    (tests that could not be run) stay NaN and do not count in the family size."""
    p = np.asarray(pvalues, np.float64)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    m = len(idx)
    running = 0.0
    for rank, i in enumerate(idx[np.argsort(p[idx], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def verdict(mean: float, p_diff_holm: float, p_tost_holm: float, alpha: float = 0.05) -> str:
    """The one label of a comparison (one of :data:`VERDICTS`), checked in this order: "equivalent within m" if
    the Holm-adjusted TOST p < α; "worse" / "better" if the Holm-adjusted difference p < α (by the sign of the mean
    Δ); else "inconclusive". An interval that merely contains 0 is never a verdict of its own."""
    if math.isfinite(p_tost_holm) and p_tost_holm < alpha:
        return "equivalent within m"
    if math.isfinite(p_diff_holm) and p_diff_holm < alpha and mean < 0:
        return "worse"
    if math.isfinite(p_diff_holm) and p_diff_holm < alpha and mean > 0:
        return "better"
    return "inconclusive"


def fieller_ratio(num: Sequence[float], den: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(ratio, low, high): ρ = mean(num) / mean(den) over paired samples (numᵢ, denᵢ), with Fieller's two-sided
    ``level`` interval, which carries the uncertainty of both means and their covariance (a t interval of
    mean(num) divided by a fixed mean(den) carries only the numerator's).

    The interval is the set of ρ whose paired differences numᵢ − ρ·denᵢ have a mean the t test (n − 1 df) does
    not reject as 0: (ā − ρb̄)² ≤ t²·(s_aa − 2ρ s_ab + ρ² s_bb) / n, i.e. A ρ² − 2B ρ + C ≤ 0 with
    A = b̄² − t² s_bb / n, B = ā b̄ − t² s_ab / n, C = ā² − t² s_aa / n. When A > 0 (mean(den) is distinguishable
    from 0 at this level) that is the bounded interval (B ∓ √(B² − AC)) / A; otherwise the set is unbounded and
    both bounds are returned as NaN. With a constant ``den`` it is the t interval of mean(num) divided by it.
    NaN bounds with fewer than two pairs, all NaN with none or a zero mean(den)."""
    from scipy import stats

    a = np.asarray(num, np.float64)
    b = np.asarray(den, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"fieller_ratio: {len(a)} numerators for {len(b)} denominators")
    n = len(a)
    if n == 0 or float(b.mean()) == 0.0:
        return math.nan, math.nan, math.nan
    a_bar, b_bar = float(a.mean()), float(b.mean())
    ratio = a_bar / b_bar
    if n < 2:
        return ratio, math.nan, math.nan
    cov = np.cov(np.stack([a, b]), ddof=1)
    s_aa, s_ab, s_bb = float(cov[0, 0]), float(cov[0, 1]), float(cov[1, 1])
    t2 = float(stats.t.ppf(0.5 + level / 2, n - 1)) ** 2 / n
    qa, qb, qc = b_bar * b_bar - t2 * s_bb, a_bar * b_bar - t2 * s_ab, a_bar * a_bar - t2 * s_aa
    if qa <= 0.0:
        return ratio, math.nan, math.nan
    root = math.sqrt(max(0.0, qb * qb - qa * qc))  # ≥ 0 when A > 0 (the quadratic is ≤ 0 at ρ = ā / b̄): rounding
    return ratio, (qb - root) / qa, (qb + root) / qa


# ---------------------------------------------------------------------------------------------------------
# Power and seed counts of a paired TOST
# ---------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _gauss_legendre(points: int = 512) -> tuple[np.ndarray, np.ndarray]:
    return np.polynomial.legendre.leggauss(points)


def tost_power(n: int, sd: float, margin: float, alpha: float = 0.05, delta: float = 0.0) -> float:
    """Exact power of the paired TOST with n pairs when the differences are N(delta, sd²):
    E_s[P(−m + t·s/√n < Δ̄ < m − t·s/√n)], t = t₁₋α,ₙ₋₁, over (n−1)s²/σ² = V ~ χ²ₙ₋₁ (Owen's integral).
    Evaluated by 512-point Gauss–Legendre quadrature in √V over the part of V's range that holds its mass
    (quantiles 1e-12 … 1 − 1e-12) and gives a non-empty acceptance interval."""
    from scipy import stats

    if n < 2 or not math.isfinite(sd) or margin <= 0:
        return math.nan
    if sd == 0.0:
        return 1.0 if abs(delta) < margin else 0.0
    df = n - 1
    q = float(stats.t.ppf(1 - alpha, df))
    root_n = math.sqrt(n)
    a_hi, a_lo = (margin - delta) * root_n / sd, (-margin - delta) * root_n / sd
    v_max = df * ((margin * root_n / sd) / q) ** 2  # beyond it the interval is wider than (−m, m)
    lo = math.sqrt(float(stats.chi2.ppf(1e-12, df)))  # in u = √V (dV = 2u du): smooth at 0 even for df = 1
    hi = math.sqrt(min(v_max, float(stats.chi2.isf(1e-12, df))))
    if hi <= lo:
        return 0.0
    nodes, weights = _gauss_legendre()
    u = lo + (hi - lo) * (nodes + 1) / 2
    w = q * u / math.sqrt(df)
    inner = np.clip(stats.norm.cdf(a_hi - w) - stats.norm.cdf(a_lo + w), 0.0, 1.0)
    value = float(np.sum(weights * inner * stats.chi2.pdf(u * u, df) * 2 * u) * (hi - lo) / 2)
    return float(min(1.0, max(0.0, value)))


def seeds_normal(sd: float, margin: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The normal formula for paired TOST at true Δ = 0: n ≈ (z₁₋α + z₁₋β/₂)²·σ²/m² (unrounded)."""
    from scipy import stats

    if not math.isfinite(sd):
        return math.nan
    z = float(stats.norm.ppf(1 - alpha) + stats.norm.ppf(1 - (1 - power) / 2))
    return z * z * sd * sd / (margin * margin)


def seeds_needed(sd: float, margin: float, alpha: float = 0.05, power: float = 0.8,
                 cap: int = 10_000_000) -> int | None:
    """Smallest n ≥ 2 whose exact TOST power (``tost_power``, true Δ = 0) reaches ``power``; None if the SD is
    unknown or more than ``cap`` seeds would be needed. The search starts at the normal formula's n (the exact n is
    at or just above it) and gallops up, then bisects; power rises with n."""
    if not math.isfinite(sd):
        return None

    def enough(n: int) -> bool:
        return tost_power(n, sd, margin, alpha) >= power

    start = max(2, math.ceil(seeds_normal(sd, margin, alpha, power)))
    if enough(start):
        lo = start
        while lo > 2 and enough(lo - 1):  # rare: the formula overshoots
            lo -= 1
        return lo
    lo, step = start, 1
    while not enough(lo + step):
        lo += step
        step *= 2
        if lo > cap:
            return None
    hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid
    return hi


def pooled_sd(tests: Sequence[dict]) -> tuple[float, int]:
    """(pooled paired SD, its degrees of freedom) over the ``paired_test`` results with n ≥ 2:
    sqrt(Σ(nᵢ−1)sᵢ² / Σ(nᵢ−1))."""
    usable = [t for t in tests if t["n"] >= 2 and math.isfinite(t["sd"])]
    df = sum(t["n"] - 1 for t in usable)
    if df == 0:
        return math.nan, 0
    return math.sqrt(sum((t["n"] - 1) * t["sd"] ** 2 for t in usable) / df), df


def sd_upper(sd: float, df: int, level: float = 0.8) -> float:
    """One-sided ``level`` upper confidence bound of an SD estimated with df degrees of freedom."""
    from scipy import stats

    if df < 1 or not math.isfinite(sd):
        return math.nan
    return sd * math.sqrt(df / float(stats.chi2.ppf(1 - level, df)))
