"""Each group of a sweep against its baseline: the per-run table (`per_run_table`: every run's
metrics, its group values, the target loss of steps_to_target), the group counts, and per group
and metric the mean and 95% interval over seeds and the paired comparison with the matching
baseline group (`compare`); `summarize` puts them together into the tidy summary (summary.csv),
with `max_stable_lr` per setting of a learning-rate sweep.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gradexp.analysis.groups import (
    LR_KEY,
    SEED_KEY,
    group_label,
    group_values,
    grouping_keys,
    natural_value,
)
from gradexp.analysis.metrics import (
    DEFAULTS,
    DIRECTIONS,
    METRICS,
    RATES,
    RUN_EXTRAS,
    SUCCESS_METRICS,
    TEST_METRICS,
    Settings,
    run_metrics,
    steps_before_divergence,
    steps_to_target,
)
from gradexp.analysis.runs import LOSS, Run
from gradexp.analysis.stats import clopper_pearson, interval, sign_test, t_interval
from gradexp.runs import rundir

COUNTS = ("runs", "completed", "diverged", "failed", "incomplete")
# The summary's rules, each written here once and stated in the report (reports.RULES):
TIE_RTOL, TIE_ATOL = 1e-6, 1e-8  # |g − b| ≤ atol + rtol·|b| is a tie (float32 keeps ~7 digits)
# a baseline of another model, dataset or experiment preset (which may choose its own model and
# dataset): seed s of one is no draw of the other's, so compared unpaired
STRUCTURE = ("model", "dataset", "experiment")


def is_unpaired(baseline: dict[str, str]) -> bool:
    """Whether groups are compared with `baseline` unpaired (a key of STRUCTURE in it)."""
    return any(key.split(".")[0] in STRUCTURE for key in baseline)
WITHOUT_DIVERGED = ("final_loss", "val_loss", "val_accuracy", "mean_loss",  # a diverged run's
                    "test_loss", "test_accuracy")
# figures from before its blow-up: it counts in `diverged`, not in these (their n says so)
# summary.csv, one row per group × metric: the group's keys and label, then these
SUMMARY_COLUMNS = ["metric", "better", "n", "mean", "std", "ci_low", "ci_high",
                   "baseline", "n_paired", "n_diff", "diff_mean", "diff_ci_low", "diff_ci_high",
                   "wins", "ties", "losses", "win_rate", "test", "sign_p", "sign_p_holm", *COUNTS,
                   "divergence_rate", "divergence_ci_low", "divergence_ci_high", "target_loss"]
# and only where the sweep has them: a rate per 0/1 metric but `diverged`, max_stable_lr
RATE_COLUMNS = {metric: [f"{name}_rate", f"{name}_ci_low", f"{name}_ci_high"]
                for metric, (name, _) in RATES.items()}


def _divergence_factor(run: Run) -> float:
    factor = (run.config.get("trainer") or {}).get("divergence_factor")
    return 1000.0 if factor is None else float(factor)


def _reported_step(run: Run) -> float:
    """The step summary.json says the run diverged at; its last step if it says diverged
    without a step (the trainer stops at the step that diverged)."""
    step = run.summary.get("diverged_step")
    if step is None and run.summary.get("diverged"):
        step = run.metrics["step"].iloc[-1]
    return math.nan if step is None else float(step)


def _success_below(run: Run) -> float:
    """The run's `dataset.success_below` (NaN for a dataset without a success criterion)."""
    below = (run.config.get("dataset") or {}).get("success_below")
    return math.nan if below is None else float(below)


def measured_metrics(runs_table: pd.DataFrame) -> list[str]:
    """The metrics of a sweep: METRICS, SUCCESS_METRICS when some run has a success and
    TEST_METRICS when some run read a test split (then per_run_table gave them columns)."""
    return [*METRICS, *(SUCCESS_METRICS if "success" in runs_table else ()),
            *(TEST_METRICS if rundir.TEST_LOSS in runs_table else ())]


def test_figures(runs: list[Run]) -> pd.DataFrame:
    """TEST_METRICS of each run, as its summary.json has them (NaN: none, or a failed run)."""
    return pd.DataFrame([{name: run.summary.get(name) if run.metrics is not None else None
                          for name in rundir.TEST_FIGURES} for run in runs],
                        columns=list(TEST_METRICS), dtype=float)


def per_run_table(runs: list[Run], keys: list[str], settings: Settings,
                  baseline: dict[str, str]) -> pd.DataFrame:
    """One row per run: directory, status, group values, seed, metrics (NaN for a failed run),
    target loss, SUCCESS_METRICS if some run has a success, TEST_METRICS if some run read a
    test split. The target needs every run's final loss: steps_to_target comes second."""
    rows = [run_metrics(run.metrics, settings, _divergence_factor(run), _reported_step(run),
                        success_below=_success_below(run))
            if run.metrics is not None else {} for run in runs]
    table = pd.concat([pd.DataFrame({"run": [r.name for r in runs],
                                     "status": [r.status for r in runs]}),
                       group_values(runs, keys),
                       pd.DataFrame(rows, columns=[*METRICS, *RUN_EXTRAS])],
                      axis=1)
    table["target_loss"] = target_losses(table, keys, baseline, settings.target_loss)
    success = pd.DataFrame(rows, columns=list(SUCCESS_METRICS))
    if success["success"].notna().any():
        table = pd.concat([table, success], axis=1)
    test = test_figures(runs)
    if test.notna().any().any():
        table = pd.concat([table, test], axis=1)
    for i, run in enumerate(runs):
        if run.metrics is not None:
            part = steps_before_divergence(run.metrics, table.at[i, "diverged_step"])
            table.at[i, "steps_to_target"] = steps_to_target(
                part[LOSS].to_numpy(float), part["step"].to_numpy(), table.at[i, "target_loss"],
                settings.spike_window)
    return table


def target_losses(table: pd.DataFrame, keys: list[str], baseline: dict[str, str],
                  fixed: float | None) -> np.ndarray:
    """The target of each run's `steps_to_target`: `fixed` if given, else the largest final
    loss among its matching baseline group's runs that did not diverge (a loss each of them
    gets down to; a diverged run's final loss is the one before its blow-up, any height); NaN
    without a baseline, or if every run of the baseline group diverged."""
    if fixed is not None or not baseline:
        return np.full(len(table), math.nan if fixed is None else float(fixed))
    finite = table[table["diverged"] == 0]
    worst = finite.groupby(keys, sort=False)["final_loss"].max().reset_index()
    partner = table[keys].assign(**baseline)
    return partner.merge(worst, on=keys, how="left")["final_loss"].to_numpy(float)


def group_counts(runs_table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group: runs, completed (finished, not diverged), diverged, failed and incomplete
    (killed or still running, not diverged)."""
    failed = runs_table["status"] == rundir.FAILED
    diverged = (runs_table["diverged"] == 1) & ~failed
    finished = runs_table["status"].isin(rundir.FINISHED)
    outcome = pd.DataFrame({
        "runs": 1, "completed": finished & ~diverged, "diverged": diverged, "failed": failed,
        "incomplete": ~finished & ~failed & ~diverged}).astype(int)
    return outcome.groupby([runs_table[k] for k in keys], sort=False).sum()


def compare(per_seed: pd.DataFrame, keys: list[str],
            baseline: dict[str, str]) -> pd.DataFrame:
    """One row per (group, metric): n seeds, mean, std and 95% interval over seeds (stats.interval:
    on the log scale for non-negative values, so never below 0; for the 0/1 RATES,
    Clopper–Pearson's); and against the matching baseline group (same values of the
    other keys, every baseline key at its baseline value), over the seeds both groups have: the
    paired differences d_s = group_s − baseline_s (mean; 95% t interval but for the RATES),
    wins, ties, losses, win rate = wins / paired seeds and the sign test of wins against losses,
    a win being a seed where the group is better (a missing value, e.g. target never reached,
    counts as worse than any value; equal values are ties)."""
    long = per_seed.melt(ignore_index=False, var_name="metric").reset_index()
    if "diverged" in per_seed:  # a diverged run's losses and accuracy are left out
        diverged = per_seed["diverged"].rename("run_diverged").reset_index()
        long = long.merge(diverged, on=[*keys, SEED_KEY], how="left")
        out = long["metric"].isin(WITHOUT_DIVERGED) & (long["run_diverged"] > 0)
        long = long[~out].drop(columns="run_diverged").reset_index(drop=True)
    by = [*keys, "metric"]
    stats = long.groupby(by, sort=False)["value"].agg(n="count", mean="mean", std="std",
                                                      low="min")
    stats["ci_low"], stats["ci_high"] = interval(stats["mean"], stats["std"], stats["n"],
                                                 stats.pop("low"))
    rate = stats.index.get_level_values("metric").isin(list(RATES))  # 0/1: no t interval
    stats.loc[rate, "ci_low"], stats.loc[rate, "ci_high"] = clopper_pearson(
        (stats["mean"] * stats["n"])[rate].round(9), stats["n"][rate])
    stats.insert(0, "better", stats.index.get_level_values("metric").map(DIRECTIONS))
    if not baseline:
        return stats.reset_index()
    if is_unpaired(baseline):
        return stats.join(unpaired(long, keys, baseline)).reset_index()
    columns = [*keys, SEED_KEY, "metric"]
    partner = long[columns].assign(**baseline).merge(long[[*columns, "value"]], how="left",
                                                     on=columns, indicator=True)
    long["baseline_value"] = partner["value"].to_numpy()
    in_baseline = (long[list(baseline)] == pd.Series(baseline)).all(axis=1)
    long["paired"] = (partner["_merge"] == "both").to_numpy() & ~in_baseline
    long["baseline"] = [group_label(dict(zip(keys, row, strict=True)))
                        for row in partner[keys].to_numpy()]
    paired = long[long["paired"]].copy()
    paired["diff"] = paired["value"] - paired["baseline_value"]
    paired["win"], paired["tie"] = _wins(paired)
    diff = paired.groupby(by, sort=False).agg(
        baseline=("baseline", "first"), n_paired=("seed", "count"), n_diff=("diff", "count"),
        diff_mean=("diff", "mean"), diff_std=("diff", "std"), wins=("win", "sum"),
        ties=("tie", "sum"))
    diff["diff_ci_low"], diff["diff_ci_high"] = t_interval(diff["diff_mean"], diff["diff_std"],
                                                           diff["n_diff"])
    metric = diff.index.get_level_values("metric")
    diff.loc[metric.isin(list(RATES)), ["diff_ci_low", "diff_ci_high"]] = np.nan
    has_better = metric.map(DIRECTIONS).notna()
    diff["losses"] = diff["n_paired"] - diff["wins"] - diff["ties"]
    diff["win_rate"] = (diff["wins"] / diff["n_paired"]).where(has_better)
    diff["sign_p"] = sign_test(diff["wins"], diff["losses"])
    diff.loc[~has_better, ["wins", "ties", "losses", "sign_p"]] = np.nan
    diff["test"] = np.where(has_better, "sign", "")
    diff["sign_p_holm"] = holm(diff["sign_p"], keys)
    return stats.join(diff.drop(columns="diff_std")).reset_index()


def unpaired(long: pd.DataFrame, keys: list[str], baseline: dict[str, str]) -> pd.DataFrame:
    """Against a baseline of another structure (model, dataset), where a seed names no common
    draw: every seed of the group against every seed of the baseline group. Δ = mean − the
    baseline's mean with Welch's 95% interval (scipy's ttest_ind, unequal variances), the
    two-sided Mann–Whitney U test (for the 0/1 RATES, Fisher's exact test on the 2×2 counts);
    no wins or ties (no pairs)."""
    from scipy.stats import fisher_exact, mannwhitneyu, ttest_ind

    values = long.groupby([*keys, "metric"], sort=False)["value"].apply(
        lambda v: v.dropna().to_numpy(float))
    rows = {}
    for index, g in values.items():
        setting = dict(zip([*keys, "metric"], index, strict=True))
        if all(setting[k] == v for k, v in baseline.items()):
            continue
        partner = tuple({**setting, **baseline}[k] for k in [*keys, "metric"])
        b = values.get(partner)
        if b is None or not len(b) or not len(g):
            continue
        row = {"baseline": group_label({k: {**setting, **baseline}[k] for k in keys}),
               "n_paired": 0, "n_diff": len(g), "diff_mean": g.mean() - b.mean(),
               "diff_ci_low": np.nan, "diff_ci_high": np.nan, "test": "", "sign_p": np.nan}
        metric = setting["metric"]
        if metric in RATES:
            table = [[g.sum(), len(g) - g.sum()], [b.sum(), len(b) - b.sum()]]
            row.update(test="fisher", sign_p=fisher_exact(table).pvalue)
        elif len(g) > 1 and len(b) > 1:
            if np.ptp(np.concatenate([g, b])) > 0:
                ci = ttest_ind(g, b, equal_var=False).confidence_interval(0.95)
                row.update(diff_ci_low=ci.low, diff_ci_high=ci.high)
            if DIRECTIONS.get(metric):
                row.update(test="mann-whitney", sign_p=mannwhitneyu(g, b).pvalue)
        rows[index] = row
    diff = pd.DataFrame.from_dict(rows, orient="index")
    if diff.empty:
        return diff
    diff.index = pd.MultiIndex.from_tuples(diff.index, names=[*keys, "metric"])
    diff["sign_p_holm"] = holm(diff["sign_p"], keys)
    return diff


def holm(p: pd.Series, keys: list[str]) -> pd.Series:
    """The sign tests' p values adjusted across the metrics of each group's comparison
    (Holm's step-down, statsmodels' `multipletests`): a family per group, NaN kept out."""
    from statsmodels.stats.multitest import multipletests

    adjusted = pd.Series(np.nan, index=p.index)
    for _, family in p.groupby(level=keys, sort=False):
        tested = family.dropna()
        if len(tested):
            adjusted[tested.index] = multipletests(tested.to_numpy(), method="holm")[1]
    return adjusted


def _wins(paired: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per paired seed: is the group better than its baseline, and is it a tie (within
    TIE_RTOL, TIE_ATOL of the baseline's value; a 1e-9 difference is no win)."""
    g, b = paired["value"].to_numpy(float), paired["baseline_value"].to_numpy(float)
    sign = paired["metric"].map(DIRECTIONS).map({"lower": -1.0, "higher": 1.0}).to_numpy(float)
    g_missing, b_missing = np.isnan(g), np.isnan(b)
    tie = np.isclose(g, b, rtol=TIE_RTOL, atol=TIE_ATOL) | (g_missing & b_missing)
    with np.errstate(invalid="ignore"):
        better = (sign * (g - b) > 0) & ~tie
    win = (better & ~g_missing & ~b_missing) | (~g_missing & b_missing)
    return win, tie


def summarize(runs: list[Run], settings: Settings = DEFAULTS,
              baseline: dict[str, str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs → (per-run table, tidy summary: one row per group × metric with the group's counts,
    its rate and interval of each 0/1 metric, and `max_stable_lr` in a learning-rate sweep)."""
    keys, baseline = grouping_keys(runs), baseline or {}
    runs_table = per_run_table(runs, keys, settings, baseline)
    metrics = measured_metrics(runs_table)
    measured = runs_table[runs_table["status"] != rundir.FAILED]  # runs sharing a seed: their mean
    tidy = compare(measured.groupby([*keys, SEED_KEY], sort=False)[metrics].mean(), keys,
                   baseline)
    counts = group_counts(runs_table, keys)
    counts["target_loss"] = runs_table.groupby(keys, sort=False)["target_loss"].first()
    # every group × metric, in order (a left merge keeps the grid's); a group with only failed
    # runs gets rows too, so that its counts show
    groups = counts.index.to_frame(index=False)
    groups = groups.iloc[sorted(range(len(groups)), key=lambda i: tuple(
        natural_value(groups.at[i, k], baseline.get(k)) for k in keys))]
    grid = groups.merge(pd.DataFrame({"metric": metrics}), how="cross")
    tidy = grid.merge(tidy, on=[*keys, "metric"], how="left")
    tidy["better"] = tidy["metric"].map(DIRECTIONS)
    tidy["n"] = tidy["n"].fillna(0).astype(int)
    tidy = tidy.merge(counts.reset_index(), on=keys, how="left")
    extra = []  # the columns only some sweeps have, after SUMMARY_COLUMNS
    for metric in RATES:
        if metric in metrics:
            rate = tidy.loc[tidy["metric"] == metric, [*keys, "mean", "ci_low", "ci_high"]]
            tidy = tidy.merge(rate.set_axis([*keys, *RATE_COLUMNS[metric]], axis=1), on=keys,
                              how="left")
            extra += RATE_COLUMNS[metric] if metric != "diverged" else []
    if LR_KEY in keys:
        tidy["max_stable_lr"] = max_stable_lr(tidy, keys)
        extra.append("max_stable_lr")
    tidy["group"] = [group_label(dict(zip(keys, row, strict=True)))
                     for row in tidy[keys].to_numpy()]
    return runs_table, tidy.reindex(columns=[*keys, "group", *SUMMARY_COLUMNS, *extra])


def max_stable_lr(tidy: pd.DataFrame, keys: list[str]) -> np.ndarray:
    """Per row of `tidy`, the largest learning rate of its setting (its values of the keys but
    the learning rate) that is stable with every smaller swept rate: max{r : every swept rate
    r' ≤ r has a measured seed and no seed diverged at r'}; NaN if the smallest rate is not
    stable (or without `optimizer.learning_rate` among the keys). A rate that reads as no
    number (`null`) is left out."""
    if LR_KEY not in keys:
        return np.full(len(tidy), math.nan)
    others = [k for k in keys if k != LR_KEY]
    rates = tidy[tidy["metric"] == "diverged"].assign(
        lr=pd.to_numeric(tidy[LR_KEY], errors="coerce"),
        stable=lambda t: (t["n"] > 0) & (t["mean"] == 0)).dropna(subset=["lr"])

    def largest_stable(setting: pd.DataFrame) -> float:
        ordered = setting.sort_values("lr")
        unstable = ~ordered["stable"].to_numpy()
        below = len(ordered) if not unstable.any() else int(np.argmax(unstable))
        return float(ordered["lr"].iloc[below - 1]) if below else math.nan

    if not others or rates.empty:  # (no swept rate that reads as a number: NaN)
        return np.full(len(tidy), largest_stable(rates))
    per_setting = rates.groupby(others, sort=False)[["lr", "stable"]].apply(largest_stable)
    found = tidy[others].merge(per_setting.rename("max_stable_lr").reset_index(), on=others,
                               how="left")
    return found["max_stable_lr"].to_numpy(float)
