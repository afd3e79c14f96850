"""Pure measurements that the trainer and the analysis share, so that a run and its summary
judge it by one rule: the divergence test and the final-loss window. NumPy only (no pandas, no
TensorFlow): `diverged` takes `isfinite` so the compiled step can apply it to tensors."""

from __future__ import annotations

import math

import numpy as np

FINAL_FRACTION = 0.1  # final_loss: the mean over the last 10% of the steps


def diverged(loss, grad_norm, skipped, isfinite=np.isfinite):
    """Elementwise, whether a step diverged: its loss is not finite, or its gradient norm is not
    finite on a step the loss-scale optimizer did not skip (under mixed_float16 an overflow
    only lowers the loss scale). `isfinite` is np.isfinite here, tf.math.is_finite when the
    trainer checks inside its compiled step: one rule for both."""
    return ~isfinite(loss) | (~isfinite(grad_norm) & (skipped == 0))


def divergence_step(steps, loss, grad_norm, skipped, factor: float,
                    first_loss: float | None = None) -> float:
    """The first step t that `diverged` or has loss_t > factor · loss_1 (loss_1: the run's
    first loss, `first_loss` when the arrays start later); NaN if none. The trainer stops a
    run at this step, and the summary finds it, by this one function."""
    loss = np.asarray(loss, float)
    if not len(loss):
        return math.nan
    first = loss[0] if first_loss is None else first_loss
    bad = diverged(loss, np.asarray(grad_norm, float), np.asarray(skipped))
    bad |= loss > factor * first
    return float(np.asarray(steps)[np.argmax(bad)]) if bad.any() else math.nan


def final_loss(loss, fraction: float = FINAL_FRACTION) -> float:
    """mean(loss_t) over the last max(1, ⌊fraction · n⌋) of the n steps (as summary.json)."""
    last = max(1, math.floor(fraction * len(loss) + 1e-9))  # 1e-9: 0.1 · 30 is 3.0000000000000004
    return float(np.asarray(loss, float)[-last:].mean())


def success_step(steps, error_rates, success_below: float) -> float:
    """The first evaluated step whose error rate is below `success_below` (Pascanu et al. 2013:
    a run has learned the adding problem when fewer than 1% of the test sequences have a
    squared error above 0.04); NaN if none. `error_rates` is NaN at steps not evaluated."""
    rates = np.asarray(error_rates, float)
    reached = rates < success_below  # NaN compares False
    return float(np.asarray(steps)[np.argmax(reached)]) if reached.any() else math.nan


def succeeded(error_rates, success_below: float, diverged_: bool) -> bool:
    """Whether a run succeeded: it did not diverge and its last evaluated error rate is below
    `success_below` (the paper's criterion, judged at the final evaluation)."""
    rates = np.asarray(error_rates, float)
    rates = rates[~np.isnan(rates)]
    return bool(not diverged_ and len(rates) and rates[-1] < success_below)


def search_objective(summary: dict, metric: str) -> float | None:
    """A run's value in a search (`hydra/sweeper=optuna`; lower is better), from its
    summary.json: +inf if it diverged, so that it ranks after every run that did not (Optuna
    accepts inf, not NaN); its `metric` (final_loss or val_loss) if it completed, +inf if that
    is not finite; None (no value: the trial fails) for a run that crashed or did not end."""
    if summary.get("diverged") or summary.get("status") == "diverged":
        return math.inf
    value = summary.get(metric)
    if summary.get("status") != "completed" or value is None:
        return None
    return float(value) if math.isfinite(value) else math.inf


def trial_objective(values: list) -> float | None:
    """A trial's value: the mean of its seeds' `search_objective`s; +inf if one diverged (a
    setting at which some seed diverges ranks after every setting at which none does); None if
    one has no value."""
    if not values or any(v is None for v in values):
        return None
    return float(np.mean(values)) if all(math.isfinite(v) for v in values) else math.inf
