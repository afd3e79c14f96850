"""Per-run metrics: one small function each, its formula in the docstring, on numpy arrays
(pandas' per-call overhead would dominate); `run_metrics` applies them all to one run's
per-step table, with the knobs in `Settings`. A diverged run is measured on its steps before
the divergence (`steps_before_divergence`). The divergence test, the final-loss window and the
success criterion are gradexp.runs.measures', shared with the trainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gradexp.analysis.runs import GRAD_NORM, LOSS
from gradexp.runs.measures import divergence_step, final_loss, succeeded, success_step

METRICS: dict[str, str | None] = {  # each metric, the better direction (None: no wins)
    "diverged": "lower", "diverged_step": None, "final_loss": "lower", "val_loss": "lower",
    "val_accuracy": "higher", "loss_spike_rate": "lower", "loss_spike_score": "lower",
    "grad_norm_spike_score": "lower", "mean_loss": "lower",
    "grad_norm_mean": None, "grad_norm_cv": "lower", "grad_norm_p99_p50": "lower",
    "grad_norm_max": "lower", "clip_fraction": None, "param_clip_fraction": None,
    "steps_to_target": "lower", "spike_skipped_steps": "lower"}
RUN_EXTRAS = ["loss_spikes", "measured_steps"]  # in runs.csv: the rate's numerator, denominator
# Only for runs whose dataset has a success criterion (an `error_rate/val` column): a sweep
# without one keeps exactly the metrics (and files) above.
SUCCESS_METRICS: dict[str, str | None] = {"success": "higher", "steps_to_success": "lower"}
# Only for runs that read a test split once after training (trainer.test): summary.json's
# figures of the final weights (gradexp.runs.rundir.TEST_FIGURES), not the per-step table's
TEST_METRICS: dict[str, str | None] = {"test_loss": "lower", "test_accuracy": "higher"}
DIRECTIONS = {**METRICS, **SUCCESS_METRICS, **TEST_METRICS}  # every metric's better direction
# The 0/1 metrics: a group's mean is a rate (exact interval, k/n), its Δ a difference of rates
# with the seeds won and lost (no t interval); the rate's name in summary.csv, what a win is.
RATES = {"diverged": ("divergence", "saved"), "success": ("success", "gained")}
ERROR_RATE = "error_rate/val"  # the share of held-out examples above the dataset's threshold


@dataclass(frozen=True)
class Settings:
    """The knobs of the metrics (the command line's options)."""

    final_fraction: float = 0.1
    spike_factor: float = 2.0
    spike_window: int = 20
    spike_min_rise: float = 0.05
    target_loss: float | None = None  # None: from each group's matching baseline group
    spike_score_window: int = 1000  # OLMo 2's spike score: the rolling window, in values
    spike_score_sigmas: float = 7.0  # and how many standard deviations away is a spike


DEFAULTS = Settings()


def trailing_mean(x: np.ndarray, window: int) -> np.ndarray:
    """m_t = mean(x_{t-window+1} … x_t) over the up-to-`window` values that exist (m_1 = x_1)."""
    sums = np.concatenate([[0.0], np.cumsum(x)])
    t = np.arange(1, len(x) + 1)
    start = np.maximum(t - window, 0)
    return (sums[t] - sums[start]) / (t - start)


def table_divergence_step(table: pd.DataFrame, factor: float,
                          reported_step: float = math.nan) -> float:
    """The earliest of the step the run reported (summary.json) and `divergence_step` of its
    table (a table without gradient norms: the loss alone decides)."""
    loss = table[LOSS].to_numpy(float)
    norm = table[GRAD_NORM].to_numpy(float) if GRAD_NORM in table else np.zeros(len(loss))
    skipped = table["skipped"].to_numpy(float) if "skipped" in table else np.zeros(len(loss))
    found = divergence_step(table["step"].to_numpy(), loss, norm, skipped, factor)
    return float(np.fmin(found, reported_step))


def steps_before_divergence(table: pd.DataFrame, diverged_at: float) -> pd.DataFrame:
    """The rows with step < diverged_at (all rows when the run did not diverge)."""
    if math.isnan(diverged_at):
        return table
    return table.iloc[: int(np.searchsorted(table["step"].to_numpy(), diverged_at))]


def last_evaluated(values: np.ndarray) -> float:
    """The last value that is not blank (validation columns are filled at evaluation steps)."""
    values = np.asarray(values, float)
    evaluated = values[~np.isnan(values)]
    return float(evaluated[-1]) if len(evaluated) else math.nan


def loss_spikes(loss: np.ndarray, factor: float = 2.0, window: int = 20,
                min_rise: float = 0.05) -> float:
    """#{t ≥ 2 : loss_t > factor · m_t  and  loss_t − m_t > min_rise · loss_1}, m_t the mean of
    the up-to-`window` losses before step t: a loss `factor` times the recent mean, by more than
    `min_rise` of the first loss (batch noise on a loss near zero doubles easily)."""
    loss = np.asarray(loss, float)
    preceding_mean = trailing_mean(loss, window)[:-1]  # of steps ≤ t-1, for t = 2 … n
    rise = loss[1:] - preceding_mean
    return float(np.sum((loss[1:] > factor * preceding_mean) & (rise > min_rise * loss[0])))


def loss_spike_rate(loss: np.ndarray, factor: float = 2.0, window: int = 20,
                    min_rise: float = 0.05) -> float:
    """100 · loss_spikes / n: spikes per 100 of the n measured steps (a run that diverges early
    has fewer steps to spike in)."""
    return 100 * loss_spikes(loss, factor, window, min_rise) / len(loss)


def spike_score(x: np.ndarray, window: int = 1000, sigmas: float = 7.0) -> float:
    """100 · #{t : s_t > 0 and |x_t − m_t| ≥ sigmas · s_t} / n: the percentage of the n values
    at least `sigmas` standard deviations away from their rolling average, m_t and s_t the mean
    and standard deviation (ddof=0) of the `window` values ending at t, x_t included (of x_1 …
    x_t while t < window). OLMo 2's spike score (Team OLMo 2024, arXiv:2501.00656 §3.2: window
    1000, 7σ, both directions), which AdaGC (Wang et al. 2025, arXiv:2502.11034) reports. Over
    k values a value's own |x_t − m_t| is at most √(k − 1) · s_t: at 7σ none of the first 49
    can count. NaN if some value is not finite (no gradient-norm column, say)."""
    x = np.asarray(x, float)
    if not len(x) or not np.isfinite(x).all():
        return math.nan
    # pandas' rolling variance: compensated sums, exactly 0 over a constant window
    rolling = pd.Series(x).rolling(window, min_periods=1)
    mean, std = rolling.mean().to_numpy(), rolling.std(ddof=0).to_numpy()
    spikes = (std > 0) & (np.abs(x - mean) >= sigmas * std)
    return float(100 * np.sum(spikes) / len(x))


def mean_loss(loss: np.ndarray) -> float:
    """mean(loss_t) over all the steps."""
    return float(np.mean(loss))


def grad_norm_mean(norm: np.ndarray) -> float:
    """mean(g) of the global gradient norm g over the steps."""
    return float(np.mean(norm))


def grad_norm_cv(norm: np.ndarray) -> float:
    """std(g) / mean(g) of the global gradient norm g over the steps (std with ddof=0)."""
    mean = np.mean(norm)
    return float(np.std(norm) / mean) if mean > 0 else math.nan


def grad_norm_p99_p50(norm: np.ndarray) -> float:
    """percentile_99(g) / percentile_50(g) (numpy's linear interpolation): how heavy the tail of
    the gradient norm is compared with its median."""
    p99, p50 = np.percentile(norm, [99, 50])
    return float(p99 / p50) if p50 > 0 else math.nan


def grad_norm_max(norm: np.ndarray) -> float:
    """max(g) over the steps."""
    return float(np.max(norm))


def clip_fraction(table: pd.DataFrame) -> float:
    """The mean over steps and over every `clip_fraction/<position>` column; 0 without any
    (no clip layer reports clipping)."""
    columns = [table[c].to_numpy(float) for c in table.columns if c.startswith("clip_fraction/")]
    return float(np.mean(columns)) if columns else 0.0


def param_clip_fraction(table: pd.DataFrame) -> float:
    """mean_t param_clip/clipped_t: the share of steps on which the parameter-clipping method
    changed the gradients; NaN without that column (runs from before it was logged)."""
    clipped = table.get("param_clip/clipped")
    return math.nan if clipped is None else float(np.mean(clipped.to_numpy(float)))


def spike_skipped_steps(table: pd.DataFrame) -> float:
    """Σ_t spike_skipped_t: the steps trainer.on_spike=skip did not apply; NaN without that
    column (a run with on_spike=none)."""
    skipped = table.get("spike_skipped")
    return math.nan if skipped is None else float(np.sum(skipped.to_numpy(float)))


def steps_to_target(loss: np.ndarray, steps: np.ndarray, target: float,
                    window: int = 20) -> float:
    """The first step t with mean(loss_{t-window+1} … loss_t) ≤ target (a trailing mean over up
    to `window` steps, so one lucky batch does not count); NaN if never (or no target)."""
    if math.isnan(target):
        return math.nan
    reached = trailing_mean(np.asarray(loss, float), window) <= target
    return float(np.asarray(steps)[np.argmax(reached)]) if reached.any() else math.nan


def success_metrics(table: pd.DataFrame, success_below: float, diverged: bool) -> dict:
    """`success`: 1 if `measures.succeeded` (the run did not diverge and its last evaluated
    error rate, on the steps before any divergence, is below `success_below`), else 0;
    `steps_to_success`: `measures.success_step`, the first evaluated step before any
    divergence whose error rate is below it (NaN if none). Both NaN without an
    `error_rate/val` column or a `success_below` (a dataset without a success criterion)."""
    if ERROR_RATE not in table or math.isnan(success_below):
        return dict.fromkeys(SUCCESS_METRICS, math.nan)
    rates = table[ERROR_RATE].to_numpy(float)
    return {"success": float(succeeded(rates, success_below, diverged)),
            "steps_to_success": success_step(table["step"].to_numpy(), rates, success_below)}


def run_metrics(table: pd.DataFrame, settings: Settings = DEFAULTS, divergence_factor=1000.0,
                reported_diverged_step: float = math.nan, target_loss: float = math.nan,
                success_below: float = math.nan) -> dict:
    """Every metric of one run's table (one row per step), SUCCESS_METRICS and RUN_EXTRAS. All
    but `diverged`, `diverged_step` and `success` (0 for a diverged run) are measured on the
    steps before the divergence (none: NaN)."""
    diverged_at = table_divergence_step(table, divergence_factor, reported_diverged_step)
    part = steps_before_divergence(table, diverged_at)
    divergence = {"diverged": float(not math.isnan(diverged_at)), "diverged_step": diverged_at}
    success = success_metrics(part, success_below, not math.isnan(diverged_at))
    if part.empty:  # diverged at its first step: nothing measured (no spikes is not 0 spikes)
        return {**dict.fromkeys([*METRICS, *RUN_EXTRAS], math.nan), **divergence, **success,
                "measured_steps": 0}
    loss = part[LOSS].to_numpy(float)
    column = {c: part[c].to_numpy(float) if c in part else np.full(len(part), math.nan)
              for c in (GRAD_NORM, "loss/val", "accuracy/val")}
    norm = column[GRAD_NORM]
    spike_settings = settings.spike_factor, settings.spike_window, settings.spike_min_rise
    score_settings = settings.spike_score_window, settings.spike_score_sigmas
    return {
        **divergence,
        "final_loss": final_loss(loss, settings.final_fraction),
        "val_loss": last_evaluated(column["loss/val"]),
        "val_accuracy": last_evaluated(column["accuracy/val"]),
        "loss_spike_rate": loss_spike_rate(loss, *spike_settings),
        "loss_spike_score": spike_score(loss, *score_settings),
        "grad_norm_spike_score": spike_score(norm, *score_settings),
        "mean_loss": mean_loss(loss),
        "grad_norm_mean": grad_norm_mean(norm),
        "grad_norm_cv": grad_norm_cv(norm),
        "grad_norm_p99_p50": grad_norm_p99_p50(norm),
        "grad_norm_max": grad_norm_max(norm),
        "clip_fraction": clip_fraction(part),
        "param_clip_fraction": param_clip_fraction(part),
        "spike_skipped_steps": spike_skipped_steps(part),
        "steps_to_target": steps_to_target(loss, part["step"].to_numpy(), target_loss,
                                           settings.spike_window),
        **success,
        "loss_spikes": loss_spikes(loss, *spike_settings),
        "measured_steps": len(loss),
    }

