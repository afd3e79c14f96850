"""Issue 12, the analysis side: Pascanu et al.'s success criterion per run (success,
steps_to_success) and per group (success rate, its exact interval, seeds gained and lost, the sign
test), and the learning-rate stability study (max_stable_lr, final_loss_vs_lr.png); all against
numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from fake_runs import ending_at, write_run

from gradexp import summarize as S
from gradexp.analysis.compare import SUMMARY_COLUMNS, max_stable_lr, summarize
from gradexp.analysis.metrics import run_metrics
from gradexp.analysis.reports import group_table, max_stable_table
from gradexp.analysis.runs import load_runs

ADDING = {"dataset": {"name": "adding", "success_below": 0.01}}
NaN = math.nan


def table(losses, error_rates):
    """A per-step table as metrics.csv reads: `error_rate/val` blank (NaN) between evaluations."""
    n = len(losses)
    return pd.DataFrame({"step": range(1, n + 1), "loss/train": losses,
                         "grad_norm/global": [1.0] * n, "error_rate/val": error_rates})


@pytest.mark.parametrize(("losses", "error_rates", "success", "step"), [
    # evaluated at steps 3, 6, 10: below 0.01 first at step 6, and still at the last evaluation
    ([1.0] * 10, [NaN, NaN, 0.5, NaN, NaN, 0.005, NaN, NaN, NaN, 0.008], 1, 6),
    # below at step 6, but the last evaluation (0.02) is not: reached, yet no success
    ([1.0] * 10, [NaN, NaN, 0.5, NaN, NaN, 0.005, NaN, NaN, NaN, 0.02], 0, 6),
    # never below 0.01 (0.01 itself is not below)
    ([1.0] * 10, [NaN, NaN, 0.5, NaN, NaN, 0.3, NaN, NaN, NaN, 0.01], 0, NaN),
    # the last row not evaluated: the last evaluation (step 9) decides
    ([1.0] * 10, [NaN] * 8 + [0.0, NaN], 1, 9),
    # diverged at step 8 (NaN loss): 0, whatever its error rate; the rate 0 evaluated at the
    # diverged step (NaN predictions count as no error) is not a success step either
    ([1.0] * 7 + [NaN, 1.0, 1.0], [NaN, NaN, 0.5, NaN, NaN, 0.005, NaN, 0.0, NaN, 0.0], 0, 6),
    ([1.0] * 7 + [NaN, 1.0, 1.0], [NaN, NaN, 0.5, NaN, NaN, 0.3, NaN, 0.0, NaN, 0.0], 0, NaN),
    ([NaN] + [1.0] * 9, [0.0] * 10, 0, NaN),  # diverged at its first step: 0, not unmeasured
], ids=["succeeded", "reached-then-lost", "never", "last-row-blank", "diverged",
        "diverged-never", "diverged-at-step-1"])
def test_success_and_steps_to_success_by_hand(losses, error_rates, success, step):
    m = run_metrics(table(losses, error_rates), success_below=0.01)
    assert m["success"] == success
    assert m["steps_to_success"] == step or (math.isnan(step) and math.isnan(m["steps_to_success"]))


@pytest.mark.slow
def test_no_criterion_is_no_success_and_leaves_other_sweeps_alone(tmp_path):
    """Without an error_rate/val column, or without dataset.success_below, success is NaN; a
    sweep in which no run has one gets no success rows or columns at all."""
    m = run_metrics(table([1.0] * 3, [0.0] * 3).drop(columns="error_rate/val"),
                    success_below=0.01)
    assert math.isnan(m["success"]) and math.isnan(m["steps_to_success"])
    m = run_metrics(table([1.0] * 3, [0.0] * 3))  # no success_below
    assert math.isnan(m["success"]) and math.isnan(m["steps_to_success"])
    for clip in ("null", "0.1"):
        write_run(tmp_path / clip, [f"clip={clip}"], ending_at(1.0))
    runs_table, tidy = summarize(load_runs(tmp_path)[0], baseline={"clip": "null"})
    assert "success" not in runs_table and "success" not in set(tidy["metric"])
    assert list(tidy.columns) == ["clip", "group", *SUMMARY_COLUMNS]
    assert "success" not in group_table(tidy, ["clip"], {"clip": "null"})


@pytest.mark.slow
def test_success_rate_interval_and_gained_lost_seeds(tmp_path):
    """The baseline succeeds on seed 4 only (1/5), the clipped group on seeds 0–3 (4/5): seeds
    0–3 gained, seed 4 lost; Δ rate +0.6; sign test 2 · P(X ≤ 1), X ~ Bin(5, ½) = 2 · 6/32 =
    0.375. Exact intervals: k = 1 of 5, [1 − 0.975^(1/5), B⁻¹(0.975; 2, 4)] = [0.00505, 0.716];
    4 of 5, [0.284, 0.975^(1/5)] = [0.284, 0.99495]."""
    for seed in range(5):
        for clip, succeeds in (("null", seed == 4), ("0.1", seed < 4)):
            errors = [None] * 4 + [0.5] + [None] * 4 + [0.0 if succeeds else 0.2]
            write_run(tmp_path / f"{clip}_{seed}", [f"clip={clip}", f"seed={seed}"],
                      ending_at(1.0), columns={"error_rate/val": errors}, config=ADDING)
    runs_table, tidy = summarize(load_runs(tmp_path)[0], baseline={"clip": "null"})
    runs = runs_table.set_index(["clip", "seed"])
    assert runs.loc[("0.1", "0"), "success"] == 1
    assert runs.loc[("0.1", "0"), "steps_to_success"] == 10
    assert runs.loc[("null", "0"), "success"] == 0
    assert math.isnan(runs.loc[("null", "0"), "steps_to_success"])
    rows = tidy[tidy["metric"] == "success"].set_index("clip")
    assert rows.loc["null", "better"] == "higher"
    assert rows.loc["null", "success_rate"] == pytest.approx(0.2)
    assert rows.loc["0.1", "success_rate"] == pytest.approx(0.8)
    assert rows.loc["null", "success_ci_low"] == pytest.approx(1 - 0.975 ** 0.2)
    assert rows.loc["null", "success_ci_high"] == pytest.approx(0.7164179, abs=1e-6)
    assert rows.loc["0.1", "ci_low"] == pytest.approx(0.2835821, abs=1e-6)
    assert rows.loc["0.1", "ci_high"] == pytest.approx(0.975 ** 0.2)
    clipped = rows.loc["0.1"]
    assert clipped["diff_mean"] == pytest.approx(0.6) and math.isnan(clipped["diff_ci_low"])
    assert (clipped["wins"], clipped["ties"], clipped["losses"]) == (4, 0, 1)
    assert clipped["sign_p"] == pytest.approx(0.375)
    assert (tidy.loc[tidy["clip"] == "0.1", "success_rate"] == 0.8).all()  # on every row
    printed = group_table(tidy, ["clip"], {"clip": "null"}).set_index("clip")
    assert printed.loc["null", "success"] == "1/5 [0.01, 0.72]"
    assert printed.loc["0.1", "success"] == "4/5 [0.28, 0.99]"
    assert printed.loc["0.1", "Δ success"] == "+0.6 (4 gained, 1 lost, p=0.38, Holm 1)"
    assert printed.loc["0.1", "steps_to_success"] == "10±0 [n=4]"


def lr_sweep(root, first_unstable):
    """Rates 0.01, 0.1, 1, 10 per model, 2 seeds; seed 0 diverges (NaN loss) at the rates in
    `first_unstable[model]`."""
    for model, unstable in first_unstable.items():
        for lr in ("0.01", "0.1", "1", "10"):
            for seed in range(2):
                losses = ([2.0, 1.0, NaN] if seed == 0 and lr in unstable
                          else ending_at(1.0 / (1 + float(lr)) + seed / 10))
                write_run(root / f"{model}_{lr}_{seed}",
                          [f"model={model}", f"optimizer.learning_rate={lr}", f"seed={seed}"],
                          losses)


def test_max_stable_lr(tmp_path):
    """a diverges at 1 and 10 → 0.1; b at 10 → 1; c at every rate → NaN; d at 0.1 only → 0.01
    (stable at 1 and 10, but a smaller rate diverged); e never → 10."""
    lr_sweep(tmp_path, {"a": ("1", "10"), "b": ("10",), "c": ("0.01", "0.1", "1", "10"),
                        "d": ("0.1",), "e": ()})
    _, tidy = summarize(load_runs(tmp_path)[0])
    keys = ["model", "optimizer.learning_rate"]
    per_model = tidy.groupby("model")["max_stable_lr"].agg(["first", "nunique"])
    assert per_model["first"].to_dict() == pytest.approx(
        {"a": 0.1, "b": 1.0, "c": NaN, "d": 0.01, "e": 10.0}, nan_ok=True)
    assert (per_model["nunique"] <= 1).all()  # the same on every row of a setting
    assert list(tidy.columns)[-1] == "max_stable_lr"
    shown = max_stable_table(tidy, keys, {})
    assert shown.to_dict("list") == {"model": ["a", "b", "c", "d", "e"],
                                     "max_stable_lr": ["0.1", "1", "—", "0.01", "10"]}


def test_max_stable_lr_of_one_seed_per_rate_and_of_a_rate_that_is_no_number(tmp_path):
    """One seed per rate: model a is stable at 0.01 and 0.1 and diverges at 1 → 0.1. Model b
    was run at `optimizer.learning_rate=null` only: no rate, so no max_stable_lr (and no error).
    Without the learning rate among the keys every row's is NaN."""
    for model, lr, losses in (("a", "0.01", ending_at(1.0)), ("a", "0.1", ending_at(1.0)),
                              ("a", "1", [2.0, 1.0, NaN]), ("b", "null", ending_at(1.0))):
        write_run(tmp_path / f"{model}_{lr}", [f"model={model}", f"optimizer.learning_rate={lr}"],
                  losses)
    _, tidy = summarize(load_runs(tmp_path)[0])
    keys = ["model", "optimizer.learning_rate"]
    per_group = tidy.groupby(keys, sort=False)["max_stable_lr"].agg(["first", "nunique"])
    assert per_group["first"].to_dict() == pytest.approx(
        {("a", "0.01"): 0.1, ("a", "0.1"): 0.1, ("a", "1"): 0.1, ("b", "null"): NaN}, nan_ok=True)
    assert (per_group["nunique"] <= 1).all()
    assert max_stable_table(tidy, keys, {}).to_dict("list") == {
        "model": ["a", "b"], "max_stable_lr": ["0.1", "—"]}
    none = max_stable_lr(tidy, ["model"])
    assert none.dtype == float and len(none) == len(tidy) and np.isnan(none).all()
    # a sweep none of whose rates reads as a number, another key swept: NaN, not a TypeError
    for model, lr in (("a", "null"), ("b", "fast")):
        write_run(tmp_path / "no_rate" / model, [f"model={model}", f"optimizer.learning_rate={lr}"],
                  ending_at(1.0))
    _, tidy = summarize(load_runs(tmp_path / "no_rate")[0])
    assert tidy["max_stable_lr"].isna().all() and len(tidy) == 2 * len(tidy["metric"].unique())


@pytest.mark.slow
def test_lr_sweep_prints_the_block_and_plots_against_the_rate(tmp_path, capsys, monkeypatch):
    lr_sweep(tmp_path, {"a": ("10",)})  # one setting: the block has one row
    from gradexp.analysis import plots

    axes, save = {}, plots._save

    def record(plt, fig, path):
        axes[path.name] = fig.axes
        return save(plt, fig, path)

    monkeypatch.setattr(plots, "_save", record)
    assert S.main([str(tmp_path), "--plots"]) == 0
    out = capsys.readouterr().out
    assert "max stable learning rate per setting" in out
    assert out.split("max stable learning rate per setting")[1].splitlines()[3].strip() == "1"
    assert (tmp_path / "final_loss_vs_lr.png").stat().st_size > 0
    (ax,) = axes["final_loss_vs_lr.png"]
    assert ax.get_xscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["final loss", "a seed diverged (loss before it)"]
    assert "## max stable learning rate per setting" in (tmp_path / "summary.md").read_text()
