"""gradexp.analysis.stats: the exact interval and the sign test by hand, and against
scipy.stats.binomtest."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.stats

from gradexp.analysis.stats import clopper_pearson, sign_test, t_half_width, t_interval


def test_clopper_pearson_and_sign_test_by_hand():
    # k = 0 and k = n have closed forms: 1 − 0.025^(1/n) and 0.025^(1/n)
    assert clopper_pearson(0, 5) == pytest.approx((0, 1 - 0.025 ** (1 / 5)))  # (0, 0.5218)
    assert clopper_pearson(5, 5) == pytest.approx((0.025 ** (1 / 5), 1))  # (0.4782, 1)
    low, high = clopper_pearson([4, 2], [5, 5])
    assert low == pytest.approx(scipy.stats.beta.ppf(0.025, [4, 2], [2, 4]))  # 0.2836, 0.0527
    assert high == pytest.approx(scipy.stats.beta.ppf(0.975, [5, 3], [1, 3]))  # 0.9949, 0.8534
    assert np.isnan(clopper_pearson(0, 0)).all()
    # two-sided, 2 · P(X ≤ min): 3 vs 1, 2 · (1 + 4) / 16; 4 vs 0, 2 · 1 / 16; 2 vs 3,
    # 2 · (1 + 5 + 10) / 32 = 1; no wins nor losses, 1
    assert sign_test([3, 4, 2, 0], [1, 0, 3, 0]) == pytest.approx([10 / 16, 2 / 16, 1, 1])


def test_clopper_pearson_is_binomtests_exact_interval():
    """scipy.stats.binomtest(k, n).proportion_ci(method="exact") is the same interval, found by
    root-finding (to ~1e-12): equal to 1e-10 for every k of n ≤ 30, k = 0 and k = n included."""
    k = np.array([k for n in range(1, 31) for k in range(n + 1)])
    n = np.array([n for n in range(1, 31) for _ in range(n + 1)])
    low, high = clopper_pearson(k, n)
    for i in range(len(k)):
        ci = scipy.stats.binomtest(k[i], n[i]).proportion_ci(0.95, method="exact")
        assert (low[i], high[i]) == pytest.approx((ci.low, ci.high), abs=1e-10), (k[i], n[i])
    assert (low[k == 0] == 0).all() and (high[k == n] == 1).all()  # exactly, not nearly


def test_sign_test_is_binomtests_p_value():
    wins, losses = np.meshgrid(np.arange(13), np.arange(13))
    p = sign_test(wins, losses)
    assert p.shape == wins.shape
    for w, m, p_value in zip(wins.ravel(), (wins + losses).ravel(), p.ravel(), strict=True):
        assert p_value == (scipy.stats.binomtest(w, m).pvalue if m else 1)
    # one-sided, the alternative of experiments/exploding_rnn/table.py: P(X ≥ wins)
    assert sign_test(3, 1, alternative="greater") == pytest.approx(5 / 16)
    assert np.isnan(sign_test(np.nan, 1)) and sign_test(0, 0, alternative="greater") == 1


def test_sign_test_of_a_single_pair():
    # one win, no loss: two-sided 1, one-sided P(X ≥ 1) = 1/2; one loss: P(X ≥ 0) = 1
    assert sign_test(1, 0) == 1 and sign_test(1, 0, alternative="greater") == 0.5
    assert sign_test(0, 1, alternative="greater") == 1


def test_t_interval_by_hand_and_nan_quietly_below_two_seeds():
    # t_{0.975, 3} = 3.182446305284263 (tables: 3.182); std 2 over 4 seeds: 3.1824 · 2 / 2
    assert t_half_width(2.0, 4) == pytest.approx(3.182446305284263, rel=1e-12)
    assert t_interval(10.0, 2.0, 4) == pytest.approx((6.817553694715737, 13.182446305284263))
    # fewer than 2 seeds: NaN, without numpy's warnings (0/0 and 1/0 at n = 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        half = t_half_width(np.array([0.0, 1.0, 1.0]), np.array([0, 0, 1]))
    assert np.isnan(half).all()
