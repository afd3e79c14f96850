"""The reports of a summary: the printed table (`group_table`, one row per group), one table
per metric (`metric_table`), the largest stable learning rate per setting (`max_stable_table`),
and summary.md (`markdown_report`); numbers formatted for reading (`mean±half-width`,
`k/n [low, high]`). summary.csv and runs.csv are compare's tables as they are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gradexp.analysis.compare import TIE_ATOL, TIE_RTOL, WITHOUT_DIVERGED, is_unpaired
from gradexp.analysis.groups import LR_KEY, group_label, varying_keys
from gradexp.analysis.metrics import DIRECTIONS, RATES, Settings

RULES = ("Against a baseline of another model, dataset or experiment preset the seeds are not "
         "paired: Welch's "
         "interval, Mann-Whitney's test (Fisher's for a rate). "
         f"Ties: values within {TIE_RTOL:g} relative ({TIE_ATOL:g} absolute) of the baseline's. "
         f"A diverged run counts in `diverged` and is left out of {', '.join(WITHOUT_DIVERGED)} "
         "(their n shows it).")


def _number(x: float, digits: int = 3) -> str:
    """`digits` significant digits, but whole numbers (and anything ≥ 100) without decimals
    or exponent: steps read as 955, not 9.55e+02."""
    if pd.isna(x):
        return "—"
    if (float(x).is_integer() or abs(x) >= 100) and abs(x) < 1e9:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "") + _number(x)


def _mean_cell(row: pd.Series, seeds: int) -> str:
    """`mean (low–high)`, the 95% interval (not symmetric on the log scale), with `[n=k]` when
    only k of the group's seeds have a value."""
    if row["n"] == 0:
        return "—"
    cell = _number(row["mean"])
    if row["ci_low"] == row["ci_high"]:  # every seed alike
        cell += "±0"
    elif not pd.isna(row["ci_high"]):
        cell += f" ({_number(row['ci_low'], 2)}–{_number(row['ci_high'], 2)})"
    return cell + (f" [n={row['n']}]" if row["n"] < seeds else "")


def _rate_cell(row: pd.Series) -> str:
    """`k/n [low, high]` of a 0/1 metric: seeds with a 1 (diverged, succeeded) of seeds
    measured, the exact 95% interval."""
    if row["n"] == 0:
        return "—"
    ones = _number(row["mean"] * row["n"])
    return f"{ones}/{row['n']} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"


def _diff_cell(row: pd.Series, baseline: dict[str, str]) -> str:
    """`Δmean±half-width wins/pairs`, for a 0/1 metric `Δrate (k saved, l lost, p=sign test)`
    (`gained` for success); `base` in a baseline group."""
    if all(row[k] == v for k, v in baseline.items()):
        return "base"
    if row.get("test") in ("mann-whitney", "fisher"):  # another model or dataset: unpaired
        cell = _signed(row["diff_mean"])
        if not pd.isna(row["diff_ci_high"]):
            cell += f"±{_number(row['diff_ci_high'] - row['diff_mean'], 2)}"
        return f"{cell} (unpaired, p={_number(row['sign_p'], 2)})"
    if pd.isna(row.get("n_paired")) or not row["n_paired"]:
        return "no pair"
    cell = "—" if pd.isna(row["diff_mean"]) else _signed(row["diff_mean"])
    if row.name in RATES:
        return (f"{cell} ({int(row['wins'])} {RATES[row.name][1]}, {int(row['losses'])} lost, "
                f"p={_number(row['sign_p'], 2)}, Holm {_number(row['sign_p_holm'], 2)})")
    if not pd.isna(row["diff_ci_high"]):
        cell += f"±{_number(row['diff_ci_high'] - row['diff_mean'], 2)}"
    if not pd.isna(row["win_rate"]):
        cell += f" {int(row['wins'])}/{int(row['n_paired'])}"
    return cell


def printed_metrics(tidy: pd.DataFrame) -> list[str]:
    """The metrics of the printed table: `val_accuracy`, or `val_loss` if no group has an
    accuracy (regression), or both if only some groups have one; the same of `test_` if some
    run read a test split; `steps_to_success` if some run reached its success criterion;
    `param_clip_fraction` and `spike_skipped_steps` if some run logged them."""
    def measured(metric: str) -> np.ndarray:  # per group: does some seed have a value
        return tidy.loc[tidy["metric"] == metric, "n"].to_numpy() > 0

    def accuracy_or_loss(split: str) -> list[str]:
        accuracy, loss = measured(f"{split}_accuracy"), measured(f"{split}_loss")
        return ([f"{split}_loss"] if not accuracy.any() else [f"{split}_accuracy"]
                if (accuracy | ~loss).all() else [f"{split}_loss", f"{split}_accuracy"])

    val = accuracy_or_loss("val")
    test = accuracy_or_loss("test") if measured("test_loss").any() else []
    param = ["param_clip_fraction"] if measured("param_clip_fraction").any() else []
    param += ["spike_skipped_steps"] if measured("spike_skipped_steps").any() else []
    success = ["steps_to_success"] if measured("steps_to_success").any() else []
    return ["final_loss", *val, *test, "loss_spike_rate", "loss_spike_score",
            "grad_norm_spike_score", "grad_norm_cv", "steps_to_target", *success,
            "clip_fraction", *param]


def group_table(tidy: pd.DataFrame, keys: list[str], baseline: dict[str, str],
                metrics: list[str] | None = None) -> pd.DataFrame:
    """One row per group: its varying keys, runs, diverged seeds/measured seeds [95% interval]
    (and against the baseline: Δ rate, seeds saved and lost, sign test), the same for success
    if some run has one, then per metric `mean±half-width` of the 95% interval over seeds and
    `Δmean±half-width wins/pairs`."""
    shown, metrics = varying_keys(tidy, keys, baseline), metrics or printed_metrics(tidy)
    rates = [m for m in RATES if (tidy["metric"] == m).any()]
    rows = []
    for _, group in tidy.groupby("group", sort=False):
        first = group.iloc[0]
        row = {k: first[k] for k in shown}
        row["runs"] = int(first["runs"])
        by_metric = group.set_index("metric")
        for rate in rates:
            row[rate] = _rate_cell(by_metric.loc[rate])
            if baseline:
                row[f"Δ {rate}"] = _diff_cell(by_metric.loc[rate], baseline)
        for metric in metrics:
            row[metric] = _mean_cell(by_metric.loc[metric], by_metric.at["diverged", "n"])
            if baseline and DIRECTIONS[metric] is not None:
                row[f"Δ {metric}"] = _diff_cell(by_metric.loc[metric], baseline)
        row["notes"] = ", ".join(f"{int(first[c])} {c}" for c in ("failed", "incomplete")
                                 if first[c])
        rows.append(row)
    table = pd.DataFrame(rows)
    return table if table["notes"].any() else table.drop(columns="notes")


def metric_table(tidy: pd.DataFrame, keys: list[str], metric: str,
                 baseline: dict[str, str]) -> pd.DataFrame:
    """One metric, one row per group: n, mean, 95% CI; against the baseline: paired seeds, Δ
    mean and its CI, and (a metric with a direction) wins, ties, losses, win rate, sign test."""
    rows = tidy[tidy["metric"] == metric]
    columns = {"n": rows["n"], "mean": rows["mean"].map(_number), "95% CI": _intervals(rows, "ci")}
    if baseline:
        columns |= {"paired": rows["n_paired"].map(_number), "Δ mean": rows["diff_mean"].map(
            _signed), "Δ 95% CI": _intervals(rows, "diff_ci")}
    if baseline and DIRECTIONS[metric]:
        columns |= {c: rows[c].map(_number) for c in ("wins", "ties", "losses")}
        columns["win rate"] = rows["win_rate"].map(lambda x: _number(x * 100) + "%" * (x >= 0))
        columns["sign p"] = rows["sign_p"].map(lambda x: _number(x, 2))
        columns["Holm p"] = rows["sign_p_holm"].map(lambda x: _number(x, 2))
    return rows[varying_keys(tidy, keys, baseline)].assign(**columns)


def has_success(tidy: pd.DataFrame) -> bool:
    """Whether the summary has the success metrics (some run's dataset has a criterion)."""
    return bool((tidy["metric"] == "success").any())


def max_stable_table(tidy: pd.DataFrame, keys: list[str],
                     baseline: dict[str, str]) -> pd.DataFrame | None:
    """One row per setting (its varying keys but the learning rate): `max_stable_lr`, the
    largest swept rate at which, and at every smaller one, no seed diverged (— if none); None
    when the learning rate is not a grouping key."""
    if "max_stable_lr" not in tidy:
        return None
    others = [k for k in varying_keys(tidy, keys, baseline) if k != LR_KEY]
    rows = tidy.drop_duplicates(others) if others else tidy.iloc[:1]
    return rows[others].assign(max_stable_lr=rows["max_stable_lr"].map(
        lambda x: "—" if pd.isna(x) else f"{x:g}"))


def _intervals(rows: pd.DataFrame, prefix: str) -> list[str]:
    return ["—" if pd.isna(low) else f"[{_number(low)}, {_number(high)}]"
            for low, high in zip(rows[f"{prefix}_low"], rows[f"{prefix}_high"], strict=True)]


def markdown_report(tidy: pd.DataFrame, keys: list[str], baseline: dict[str, str],
                    settings: Settings, skipped: list[tuple[str, str]], root: Path) -> str:
    """summary.md: the settings, the key table, one table per metric, the skipped runs."""
    fixed = [k for k in keys if k not in varying_keys(tidy, keys, baseline)]
    lines = [f"# Sweep summary: {root}", ""]
    if fixed:
        first = tidy.iloc[0]
        lines.append("Same in every run: " + group_label({k: first[k] for k in fixed}) + "  ")
    lines.append(comparison_note(baseline, settings, has_success(tidy)) + "  ")
    stable = max_stable_table(tidy, keys, baseline)
    lines += [f"Metrics: final fraction {settings.final_fraction}, spike factor "
              f"{settings.spike_factor}, spike window {settings.spike_window} steps, "
              f"spike minimum rise {settings.spike_min_rise} × first loss, spike score "
              f"{settings.spike_score_sigmas}σ over a rolling window of "
              f"{settings.spike_score_window} steps "
              "(definitions: docs/guide/summarizing.md).", "",
              "## Groups", "",
              group_table(tidy, keys, baseline).to_markdown(index=False), ""]
    if stable is not None:
        lines += ["## " + MAX_STABLE_TITLE, "", stable.to_markdown(index=False), ""]
    for metric in tidy["metric"].unique():
        better = DIRECTIONS[metric]
        direction = {"lower": " (lower is better)", "higher": " (higher is better)"}.get(better, "")
        lines += [f"## {metric}{direction}", "",
                  metric_table(tidy, keys, metric, baseline).to_markdown(index=False), ""]
    if skipped:
        lines += ["## Skipped runs", ""] + [f"- `{d}`: {reason}" for d, reason in skipped] + [""]
    return "\n".join(lines)


MAX_STABLE_TITLE = ("max stable learning rate per setting (the largest swept rate at which, and "
                    "at every smaller one, no seed diverged)")


def comparison_note(baseline: dict[str, str], settings: Settings,
                    success: bool = False) -> str:
    """The sentence that says what is compared with what (printed above the table); `success`:
    and the sentence on the success columns."""
    if not baseline:
        return "No baseline (pass --baseline KEY=VALUE): no comparisons."
    setting = ",".join(f"{k}={v}" for k, v in baseline.items())
    target = (f"target loss {settings.target_loss}" if settings.target_loss is not None else
              "target loss: the worst final loss of the matching baseline group's runs that "
              "did not diverge")
    if is_unpaired(baseline):
        return (f"Baseline {setting}: each group against the group with the same other values "
                f"and {setting}, unpaired; Δ = difference of the means with Welch's 95% "
                "interval, p of Mann-Whitney's test (Fisher's exact test for a rate), "
                f"two-sided, and Holm's adjustment across the group's metrics; {target}. "
                f"{RULES}")
    return (f"Baseline {setting}: each group against the group with the same other values "
            f"and {setting}, paired by seed; Δ = group − baseline, mean ± 95% t interval "
            f"over paired seeds, wins/pairs; diverged: seeds diverged/seeds [exact 95% "
            f"interval], Δ diverged: difference of the rates over paired seeds, seeds saved "
            f"(baseline diverged, group did not) and lost, p of the exact sign test "
            f"(two-sided) and Holm's adjustment across the group's metrics; {target}. "
            f"{RULES}"
            + (" success: seeds that succeeded/seeds [exact 95% interval], Δ success: "
               "difference of the rates, seeds gained (group succeeded, baseline did not) and "
               "lost, p of the exact sign test." if success else ""))

