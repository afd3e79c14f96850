"""The PNGs of `python -m gradexp.summarize DIR --plots`: the loss curves and the gradient norms
per group (mean over seeds, the loss with its 95% band: analysis.curves), the final loss against
each baseline key, and in a learning-rate sweep against the learning rate (log axis). matplotlib
(Agg) is imported only here, inside `plot_all`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gradexp.analysis.curves import across_seeds, group_curves
from gradexp.analysis.groups import LR_KEY, group_label, natural_value, varying_keys
from gradexp.analysis.metrics import Settings
from gradexp.analysis.runs import LOSS, Run


def plot_all(runs: list[Run], runs_table: pd.DataFrame, tidy: pd.DataFrame, keys: list[str],
             baseline: dict[str, str], settings: Settings, out: Path) -> list[Path]:
    """Write loss_curves.png, grad_norms.png, final_loss_vs_<key>.png (per baseline key, or
    for the first key shown without a baseline) and, when the learning rate is a grouping key,
    final_loss_vs_lr.png into `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = varying_keys(tidy, keys, baseline)
    curves = group_curves(runs, runs_table, tidy, keys, baseline)
    order = list(curves)
    colors = plt.get_cmap("tab10" if len(order) <= 10 else "viridis")
    color = {label: colors(i if len(order) <= 10 else i / max(1, len(order) - 1))
             for i, label in enumerate(order)}
    written = [_plot_losses(plt, curves, color, settings, out / "loss_curves.png"),
               _plot_grad_norms(plt, curves, color, settings, out / "grad_norms.png")]
    for x_key in list(baseline) or shown[:1]:
        written.append(_plot_final_loss(plt, tidy, shown, x_key, baseline.get(x_key),
                                        out / f"final_loss_vs_{_filename(x_key)}.png"))
    if LR_KEY in keys:
        written.append(_plot_final_loss(plt, tidy, shown, LR_KEY, None,  # a swept key: shown
                                        out / "final_loss_vs_lr.png", log_x=True))
    return [p for p in written if p is not None]


def _filename(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key)


def _plot_losses(plt, curves, color, settings: Settings, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5))
    bands = {label: across_seeds(tables, LOSS, settings.spike_window)
             for label, tables in curves.items()}
    # on the log axis, a band reaching below half the lowest mean (with few seeds the interval
    # often reaches 0) ends there, so the axis shows the curves, not decades of empty band
    means = np.concatenate([b["mean"].to_numpy(float) for b in bands.values()] or [np.empty(0)])
    floor = means[means > 0].min() / 2 if (means > 0).any() else None
    for label, band in bands.items():
        if band.empty:
            continue
        ax.plot(band.index, band["mean"], color=color[label],
                label=f"{label} (n={len(curves[label])})")
        ax.fill_between(band.index, band["lower"].clip(lower=floor), band["upper"],
                        color=color[label], alpha=0.2)
    ax.set(yscale="log", xlabel="step",
           ylabel=f"loss/train, trailing mean over {settings.spike_window} steps",
           title="Training loss: mean over seeds, 95% band (diverged runs end early)")
    ax.legend(fontsize="small")
    return _save(plt, fig, path)


def _plot_grad_norms(plt, curves, color, settings: Settings, path: Path) -> Path | None:
    columns = {c for tables in curves.values() for t in tables for c in t.columns}
    positions = sorted({c.split("/")[1] for c in columns
                        if c.startswith("grad_norm/") and c.endswith("/pre")})
    if not positions:
        return None
    fig, axes = plt.subplots(1, len(positions), figsize=(max(8.0, 4.5 * len(positions)), 4.5),
                             sharey=True, squeeze=False)  # ≥ 8 in: the title fits one panel
    for ax, position in zip(axes[0], positions, strict=True):
        for label, tables in curves.items():
            for side, style in (("pre", "-"), ("post", "--")):
                band = across_seeds(tables, f"grad_norm/{position}/{side}",
                                    settings.spike_window)
                if not band.empty:
                    ax.plot(band.index, band["mean"], style, color=color[label], linewidth=1,
                            label=label if side == "pre" else None)
        ax.set(yscale="log", xlabel="step", title=f"‖dy‖ at {position}")
    axes[0][0].set_ylabel(f"‖dy‖, mean over seeds, trailing mean over {settings.spike_window}")
    fig.suptitle("Gradient norm reaching each clip layer: before the clip solid, after dashed")
    for ax in axes[0]:  # each panel names its own groups: groups may clip at different positions
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small")
    return _save(plt, fig, path)


def _plot_final_loss(plt, tidy, shown, x_key, baseline_value, path: Path,
                     log_x: bool = False) -> Path | None:
    """Final loss (mean, 95% interval over seeds) against `x_key`, a line per combination of
    the other keys shown: at evenly spaced values with error bars, or (`log_x`, the learning
    rate) at the numbers themselves on a log axis with a band, groups where a seed diverged
    marked ×."""
    rows = tidy[(tidy["metric"] == "final_loss") & (tidy["n"] > 0)]
    if log_x:
        rows = rows.assign(x=pd.to_numeric(rows[x_key], errors="coerce")).dropna(subset=["x"])
        rows = rows[rows["x"] > 0]
    if rows.empty:
        return None
    x_values = sorted(rows[x_key].unique(), key=lambda v: natural_value(v, baseline_value))
    position = {v: i for i, v in enumerate(x_values)}
    if not log_x:
        rows = rows.assign(x=rows[x_key].map(position))
    others = [k for k in shown if k != x_key]
    # Diverged runs' final losses (the loss before the blow-up) can sit decades above the rest:
    # then a log axis, on which an interval reaching down to 0 or below ends at the axis' bottom.
    means = rows["mean"].to_numpy(float)
    floor = means.min() / 3 if (means > 0).all() and means.max() > 100 * means.min() else None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for combination, line in (rows.groupby(others, sort=False) if others else [((), rows)]):
        line = line.sort_values("x")
        label = (group_label(dict(zip(others, np.atleast_1d(combination), strict=True)))
                 or "final loss")
        low = line["ci_low"] if floor is None else line["ci_low"].clip(lower=floor)
        if log_x:
            (drawn,) = ax.plot(line["x"], line["mean"], marker="o", label=label)
            ax.fill_between(line["x"], low, line["ci_high"], color=drawn.get_color(), alpha=0.2)
            continue
        err = np.vstack([line["mean"] - low, line["ci_high"] - line["mean"]])
        ax.errorbar(line["x"], line["mean"], yerr=np.nan_to_num(err),
                    marker="o", capsize=3, label=label)
    if log_x:
        diverged = rows[rows["divergence_rate"] > 0]
        if not diverged.empty:
            ax.scatter(diverged["x"], diverged["mean"], marker="x", s=90, color="black",
                       zorder=3, label="a seed diverged (loss before it)")
        ax.set(xscale="log")
    else:
        ax.set_xticks(range(len(x_values)), x_values)
    ax.set(xlabel=x_key, ylabel="final loss (mean over seeds, 95% CI)",
           title=f"Final loss against {x_key}")
    if floor is not None:
        ax.set(yscale="log", ylim=(floor, None))
    ax.legend(fontsize="small")
    return _save(plt, fig, path)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
