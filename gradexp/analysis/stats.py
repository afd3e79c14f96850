"""Statistics over seeds, by scipy.stats: the 95% Student-t interval of a mean, the exact
(Clopper–Pearson) 95% interval of a rate, and the exact sign test. Vectorized over arrays (the
callers pass a column per group); scipy.stats is imported inside each function, not here: it
takes about a second to import, which `python -m gradexp.summarize --help` need not pay.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def t_half_width(std: Any, n: Any) -> Any:
    """t_{0.975, n-1} · std / √n: the half-width of the 95% Student-t interval of a mean over n
    seeds (std with ddof=1); NaN when n < 2. Vectorized over arrays."""
    from scipy.stats import t

    n = np.asarray(n, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n >= 2, t.ppf(0.975, np.maximum(n - 1, 1)) * std / np.sqrt(n), np.nan)


def t_interval(mean: Any, std: Any, n: Any) -> tuple[Any, Any]:
    """95% Student-t interval of a mean over n seeds: mean ± t_half_width(std, n); NaN when
    n < 2. Vectorized over arrays."""
    half = t_half_width(std, n)
    return mean - half, mean + half


def interval(mean: Any, std: Any, n: Any, low: Any) -> tuple[Any, Any]:
    """The summary's 95% interval of a mean over n seeds: `log_t_interval` where the values are
    non-negative (`low`, their minimum, ≥ 0: a loss, a norm, a count), so that it stays ≥ 0;
    else `t_interval`. Vectorized over arrays."""
    t_low, t_high = t_interval(mean, std, n)
    log_low, log_high = log_t_interval(mean, std, n)
    positive = np.asarray(low, float) >= 0
    return np.where(positive, log_low, t_low), np.where(positive, log_high, t_high)


def log_t_interval(mean: Any, std: Any, n: Any) -> tuple[Any, Any]:
    """95% interval of a non-negative mean on the log scale: [x̄ / f, x̄ · f] with
    f = exp(t_{0.975, n−1} · s / (x̄ √n)), the Student-t interval of log x̄ with the delta
    method's standard error s / (x̄ √n); never below 0, [0, 0] where x̄ = 0 (every value 0),
    NaN when n < 2. Vectorized over arrays."""
    mean, half = np.asarray(mean, float), t_half_width(std, n)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        factor = np.exp(half / mean)
        low, high = mean / factor, mean * factor
    zero = (mean == 0) & ~np.isnan(half)
    return np.where(zero, 0.0, low), np.where(zero, 0.0, high)


def clopper_pearson(k: Any, n: Any) -> tuple[Any, Any]:
    """Exact 95% interval of a rate of k in n: [B⁻¹(0.025; k, n−k+1), B⁻¹(0.975; k+1, n−k)], the
    lower end 0 for k = 0 and the upper 1 for k = n (B⁻¹: the quantile of the beta
    distribution); NaN for n = 0. Vectorized over arrays.

    This is `scipy.stats.binomtest(k, n).proportion_ci(0.95, method="exact")` in closed form:
    that one finds each end by root-finding, to about 1e-12 (tests/test_analysis_stats.py
    checks the two agree); the quantile is exact to the last digit."""
    from scipy.stats import beta

    k, n = np.asarray(k, float), np.asarray(n, float)
    with np.errstate(invalid="ignore"):
        low = np.where(k > 0, beta.ppf(0.025, np.maximum(k, 1e-300), n - k + 1), 0.0)
        high = np.where(k < n, beta.ppf(0.975, k + 1, np.maximum(n - k, 1e-300)), 1.0)
    return np.where(n > 0, low, np.nan), np.where(n > 0, high, np.nan)


def sign_test(wins: Any, losses: Any, alternative: str = "two-sided") -> Any:
    """Exact sign test of wins against losses (ties left out): the p-value of
    `scipy.stats.binomtest(wins, wins + losses, p=0.5, alternative=...)` — two-sided, min(1,
    2 · P(X ≤ min(wins, losses))), X ~ Binomial(wins + losses, 1/2); "greater", P(X ≥ wins);
    1 without either, NaN where a count is NaN. On 0/1 values (`diverged`) this is the exact
    McNemar test on the discordant pairs. Vectorized (elementwise: there are few groups)."""
    from scipy.stats import binomtest

    wins, losses = np.broadcast_arrays(np.asarray(wins, float), np.asarray(losses, float))
    shape, wins, pairs = wins.shape, wins.ravel(), (wins + losses).ravel()
    p = np.where(np.isnan(pairs), np.nan, 1.0)
    for i in np.flatnonzero(pairs > 0):
        p[i] = binomtest(int(wins[i]), int(pairs[i]), p=0.5, alternative=alternative).pvalue
    return p.reshape(shape)
