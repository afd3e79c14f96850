"""gradexp.runs.measures, the rules the trainer and the summary share, on small arrays by hand
(NumPy only: fast)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradexp.runs.measures import (
    FINAL_FRACTION,
    diverged,
    divergence_step,
    final_loss,
    search_objective,
    succeeded,
    success_step,
    trial_objective,
)

INF, NAN = math.inf, math.nan


def test_diverged_elementwise():
    loss = np.array([1.0, NAN, INF, 1.0, 1.0, 1.0])
    norm = np.array([1.0, 1.0, 1.0, INF, NAN, INF])
    skipped = np.array([0, 0, 0, 0, 0, 1])
    # a non-finite loss; a non-finite norm unless the loss-scale optimizer skipped the step
    assert diverged(loss, norm, skipped).tolist() == [False, True, True, True, True, False]
    assert diverged(NAN, 1.0, 1) and not diverged(1.0, INF, 1.0)


def test_divergence_step_by_hand():
    steps = np.array([10, 20, 30, 40])
    norm, skipped = np.ones(4), np.zeros(4)
    # factor 3: 7 > 3 · 2 at step 30 (the first loss is 2); 6 = 3 · 2 is not above it
    assert divergence_step(steps, [2.0, 6.0, 7.0, 1.0], norm, skipped, 3.0) == 30
    assert math.isnan(divergence_step(steps, [2.0, 6.0, 6.0, 1.0], norm, skipped, 3.0))
    # the first non-finite loss or norm, whichever comes first; a skipped step does not count
    assert divergence_step(steps, [2.0, 1, NAN, 1], norm, skipped, 1000) == 30
    assert divergence_step(steps, [2.0, 1, 1, 1], [1, INF, 1, 1], skipped, 1000) == 20
    assert math.isnan(divergence_step(steps, [2.0, 1, 1, 1], [1, INF, 1, 1], [0, 1, 0, 0], 1000))
    # the reference is the run's first loss, `first_loss` when the arrays start later
    assert math.isnan(divergence_step(steps[2:], [5.0, 7.0], norm[2:], skipped[2:], 3.0))
    assert divergence_step(steps[2:], [5.0, 7.0], norm[2:], skipped[2:], 3.0, first_loss=2.0) == 40
    assert math.isnan(divergence_step([], [], [], [], 3.0))  # no steps


def test_final_loss_window():
    assert FINAL_FRACTION == 0.1
    loss = np.arange(1.0, 21.0)  # 1 … 20: the last 10% is the last 2 steps
    assert final_loss(loss) == 19.5
    assert final_loss(loss, 0.25) == 18.0  # the last 5: 16 … 20
    assert final_loss([3.0, 1.0]) == 1.0  # at least one step
    assert final_loss(np.arange(30.0)) == 28.0  # ⌊0.1 · 30⌋ = 3 (0.1 · 30 is 3.0000000000000004)


def test_success_step_and_succeeded():
    steps = np.array([100, 200, 300, 400])
    rates = np.array([0.5, NAN, 0.008, 0.02])  # NaN: not evaluated at step 200
    assert success_step(steps, rates, 0.01) == 300
    assert success_step(steps, rates, 0.6) == 100
    assert math.isnan(success_step(steps, rates, 0.005))
    assert math.isnan(success_step(steps, rates, 0.008))  # below, not equal
    # judged at the last evaluation: 0.02 is not below 0.01 (reached at 300, lost after)
    assert not succeeded(rates, 0.01, False) and succeeded(rates, 0.03, False)
    assert not succeeded(rates, 0.03, True)  # a diverged run never succeeds
    assert succeeded([0.5, 0.005, NAN], 0.01, False)  # the last evaluated value, not the last row
    assert not succeeded([NAN, NAN], 0.01, False) and not succeeded([], 0.01, False)
    assert not succeeded([0.01], 0.01, False)  # below, not equal
    assert succeeded([0.0], 0.01, False) is True


@pytest.mark.parametrize(("summary", "value"), [
    ({"status": "completed", "final_loss": 0.25}, 0.25),
    ({"status": "completed", "final_loss": 3}, 3.0),
    ({"status": "completed", "final_loss": NAN}, INF),  # not finite: ranks last
    ({"status": "completed", "final_loss": INF}, INF),
    ({"status": "diverged", "final_loss": 0.25}, INF),
    ({"status": "completed", "diverged": True, "final_loss": 0.25}, INF),
    ({"status": "completed", "diverged": False, "final_loss": 0.25}, 0.25),
    ({"status": "completed"}, None),  # no value
    ({"status": "completed", "final_loss": None}, None),
    ({"status": "failed", "final_loss": 0.25}, None),  # crashed: the trial fails
    ({"status": "running", "final_loss": 0.25}, None),
    ({"final_loss": 0.25}, None),
], ids=["completed", "int", "nan", "inf", "diverged-status", "diverged-flag", "not-diverged",
        "no-metric", "metric-none", "failed", "running", "no-status"])
def test_search_objective(summary, value):
    got = search_objective(summary, "final_loss")
    assert got == value and type(got) is type(value)


def test_search_objective_reads_the_metric_it_is_asked_for():
    summary = {"status": "completed", "final_loss": 0.25, "val_loss": 0.5}
    assert search_objective(summary, "val_loss") == 0.5


def test_trial_objective():
    assert trial_objective([1.0, 2.0, 4.5]) == 2.5  # the mean of the seeds
    assert trial_objective([1.0, INF]) == INF  # one seed diverged
    assert trial_objective([1.0, None]) is None and trial_objective([None]) is None
    assert trial_objective([]) is None
    assert type(trial_objective([1, 2])) is float
    # never NaN (Optuna refuses it): a value that is not finite ranks the trial last
    assert trial_objective([1.0, NAN]) == INF
