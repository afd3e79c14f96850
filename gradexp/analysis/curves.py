"""Curves across seeds: each group's per-step tables (`group_curves`) and, per step, the mean
over its seeds with the 95% Student-t band (`across_seeds`). One definition serves the PNGs of
`--plots` (analysis.plots) and the TensorBoard runs of `--tensorboard` (analysis.bands_tb).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gradexp.analysis.groups import group_label, varying_keys
from gradexp.analysis.metrics import steps_before_divergence
from gradexp.analysis.runs import Run
from gradexp.analysis.stats import interval

BAND_COLUMNS = ["n", "mean", "lower", "upper"]


def group_curves(runs: list[Run], runs_table: pd.DataFrame, tidy: pd.DataFrame,
                 keys: list[str], baseline: dict[str, str]) -> dict[str, list[pd.DataFrame]]:
    """Group label (`clip=0.1`, the keys that vary, as in the tables) → each of its seeds'
    per-step tables indexed by step, cut before the step the run diverged at; groups in the
    tables' order (the baseline first); a failed run (no table) contributes nothing."""
    shown = varying_keys(tidy, keys, baseline)
    labels = runs_table[shown].apply(lambda row: group_label(row.to_dict()), axis=1)
    order = list(dict.fromkeys(tidy[shown].apply(lambda row: group_label(row.to_dict()),
                                                 axis=1)))
    curves: dict[str, list[pd.DataFrame]] = {label: [] for label in order}
    for run, label, diverged_at in zip(runs, labels, runs_table["diverged_step"], strict=True):
        if run.metrics is not None:
            curves[label].append(
                steps_before_divergence(run.metrics, diverged_at).set_index("step"))
    return curves


def across_seeds(tables: list[pd.DataFrame], column: str, window: int = 1) -> pd.DataFrame:
    """Per step (the index), over the seeds that have a value of `column` there (blank steps,
    e.g. a validation column between evaluations, and steps after a run's divergence left out),
    each seed's series first smoothed by a trailing mean over `window` of its values:

        n      the number of seeds
        mean   x̄ = Σ x_i / n
        lower  the 95% interval of the mean the tables give (analysis.stats.interval): where
        upper  the values are non-negative, x̄ / f and x̄ · f, f = exp(t_{0.975, n−1} · s /
               (x̄ √n)) (on the log scale: never below 0); else x̄ ∓ t_{0.975, n−1} · s / √n

    Where n = 1 the band has no width (lower = upper = mean): one seed gives no interval.
    Empty (these columns) when no seed has the column."""
    series = [t[column].dropna().rolling(window, min_periods=1).mean()
              for t in tables if column in t]
    series = [s for s in series if len(s)]
    if not series:
        return pd.DataFrame(columns=BAND_COLUMNS)
    wide = pd.concat(series, axis=1).sort_index()
    n = wide.count(axis=1)
    mean = wide.mean(axis=1)
    lower, upper = interval(mean, wide.std(axis=1, ddof=1), n, wide.min(axis=1))
    alone = n.to_numpy() < 2
    return pd.DataFrame({"n": n, "mean": mean, "lower": np.where(alone, mean, lower),
                         "upper": np.where(alone, mean, upper)}, index=wide.index)
