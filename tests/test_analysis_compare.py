"""gradexp.analysis.compare: each group against its matching baseline group over paired seeds
(differences, intervals, win rates, divergence rates, target losses), and the printed cells."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from fake_runs import ending_at, write_run

from gradexp.analysis.compare import _wins, compare, group_counts, is_unpaired, summarize
from gradexp.analysis.metrics import DIRECTIONS, Settings
from gradexp.analysis.reports import comparison_note, group_table
from gradexp.analysis.runs import load_runs

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

def t_interval(values):
    """scipy's 95% Student-t interval of the mean of `values`."""
    return scipy.stats.t.interval(0.95, len(values) - 1, loc=np.mean(values),
                                  scale=scipy.stats.sem(values))


def log_t_interval(values):
    """The same on the log scale (the delta method's SE(log x̄) = sem / x̄): [x̄ / f, x̄ · f]."""
    mean = np.mean(values)
    half = scipy.stats.t.ppf(0.975, len(values) - 1) * scipy.stats.sem(values)
    return mean / math.exp(half / mean), mean * math.exp(half / mean)


def test_paired_differences_interval_and_win_rate(tmp_path):
    base, clipped = [1.0, 2.0, 3.0], [0.5, 2.5, 2.0, 9.0]  # final losses per seed
    for seed, final in enumerate(base):
        write_run(tmp_path / f"b{seed}", ["clip=null", f"seed={seed}"], ending_at(final))
    for seed, final in enumerate(clipped):  # seed 3 has no baseline run: not paired
        write_run(tmp_path / f"c{seed}", ["clip=0.1", f"seed={seed}"], ending_at(final))
    runs, skipped = load_runs(tmp_path)
    assert len(runs) == 7 and skipped == []
    _, tidy = summarize(runs, baseline={"clip": "null"})
    row = tidy[(tidy["clip"] == "0.1") & (tidy["metric"] == "final_loss")].iloc[0]
    assert row["n"] == 4 and row["mean"] == pytest.approx(np.mean(clipped))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(log_t_interval(clipped))
    assert t_interval(clipped)[0] < 0 < row["ci_low"]  # a loss's interval stays above 0
    diffs = [-0.5, 0.5, -1.0]  # seeds 0, 1, 2 only
    assert row["baseline"] == "clip=null" and row["n_paired"] == 3
    assert row["diff_mean"] == pytest.approx(np.mean(diffs))
    assert (row["diff_ci_low"], row["diff_ci_high"]) == pytest.approx(t_interval(diffs))
    assert (row["wins"], row["ties"], row["win_rate"]) == (2, 0, pytest.approx(2 / 3))
    assert row["losses"] == 1 and row["sign_p"] == 1  # 2 · P(X ≤ 1), X ~ Bin(3, 1/2) = 2 · 4/8
    # the baseline group itself is not compared; no-direction metrics have no win rate
    base_row = tidy[(tidy["clip"] == "null") & (tidy["metric"] == "final_loss")].iloc[0]
    assert math.isnan(base_row["diff_mean"]) and math.isnan(base_row["win_rate"])
    clip_row = tidy[(tidy["clip"] == "0.1") & (tidy["metric"] == "clip_fraction")].iloc[0]
    assert math.isnan(clip_row["win_rate"]) and clip_row["diff_mean"] == 0
    # counts
    assert (row["runs"], row["completed"], row["diverged"], row["failed"]) == (4, 4, 0, 0)


def test_divergence_rate_interval_and_saved_lost_seeds(tmp_path):
    """Baseline seeds diverge 1,1,1,1,0 and the clipped group's 0,0,1,0,1: 4/5 against 2/5;
    seeds 0, 1, 3 saved, seed 4 lost, seed 2 a tie; Δ rate −0.4, sign test p = 10/16."""
    for seed, (base, clipped) in enumerate(zip([1, 1, 1, 1, 0], [0, 0, 1, 0, 1], strict=True)):
        for clip, bad in (("null", base), ("0.1", clipped)):
            write_run(tmp_path / f"{clip}_{seed}", [f"clip={clip}", f"seed={seed}"],
                      [2.0, 1.0, math.nan if bad else 1.0])
    runs_table, tidy = summarize(load_runs(tmp_path)[0], baseline={"clip": "null"})
    rows = tidy[tidy["metric"] == "diverged"].set_index("clip")
    assert rows.loc["null", "divergence_rate"] == 0.8 and rows.loc["0.1", "divergence_rate"] == 0.4
    assert (rows.loc["null", "ci_low"], rows.loc["null", "ci_high"]) == pytest.approx(
        scipy.stats.beta.ppf([0.025, 0.975], [4, 5], [2, 1]))
    assert (rows.loc["0.1", "divergence_ci_low"], rows.loc["0.1", "divergence_ci_high"]) == (
        pytest.approx(scipy.stats.beta.ppf([0.025, 0.975], [2, 3], [4, 3])))
    clipped = rows.loc["0.1"]
    assert clipped["diff_mean"] == pytest.approx(-0.4) and clipped["n_paired"] == 5
    assert (clipped["wins"], clipped["ties"], clipped["losses"]) == (3, 1, 1)
    assert clipped["sign_p"] == pytest.approx(10 / 16)
    assert math.isnan(clipped["diff_ci_low"])  # no t interval on 0/1 values
    # every row of a group carries its divergence rate and interval
    group = tidy[tidy["clip"] == "0.1"]
    assert (group["divergence_rate"] == 0.4).all() and group["divergence_ci_low"].nunique() == 1
    printed = group_table(tidy, ["clip"], {"clip": "null"}).set_index("clip")
    assert printed.loc["null", "diverged"] == "4/5 [0.28, 0.99]"
    assert printed.loc["0.1", "diverged"] == "2/5 [0.05, 0.85]"
    assert printed.loc["0.1", "Δ diverged"] == "-0.4 (3 saved, 1 lost, p=0.62, Holm 1)"
    assert printed.loc["null", "Δ diverged"] == "base"


def test_each_group_meets_its_own_baseline_and_target(tmp_path):
    """clip × layer.scale: (0.1, 3) is compared with (null, 3), not with (null, 1); the target
    loss of steps_to_target is the matching baseline group's largest final loss."""
    finals = {("null", "1"): [1.0, 1.0], ("null", "3"): [3.0, 5.0],
              ("0.1", "1"): [2.0, 2.0], ("0.1", "3"): [2.0, 2.0]}
    for (clip, scale), per_seed in finals.items():
        for seed, final in enumerate(per_seed):
            write_run(tmp_path / f"{clip}_{scale}_{seed}",
                      [f"clip={clip}", f"layer.scale={scale}", f"seed={seed}"],
                      [6.0, 5.0, 4.0, final])
    runs, _ = load_runs(tmp_path)
    settings = Settings(spike_window=1)
    runs_table, tidy = summarize(runs, settings, baseline={"clip": "null"})
    final = tidy[tidy["metric"] == "final_loss"].set_index(["clip", "layer.scale"])
    assert final.loc[("0.1", "3"), "baseline"] == "clip=null layer.scale=3"
    assert final.loc[("0.1", "3"), "diff_mean"] == pytest.approx(2.0 - 4.0)
    assert final.loc[("0.1", "1"), "diff_mean"] == pytest.approx(2.0 - 1.0)
    assert final.loc[("0.1", "3"), "win_rate"] == 1 and final.loc[("0.1", "1"), "win_rate"] == 0
    targets = runs_table.set_index(["clip", "layer.scale", "seed"])["target_loss"]
    assert targets[("0.1", "3", "0")] == 5.0 and targets[("0.1", "1", "0")] == 1.0
    steps = runs_table.set_index(["clip", "layer.scale", "seed"])["steps_to_target"]
    # losses 6, 5, 4, final with window 1: the first step with loss <= target
    assert steps[("0.1", "3", "0")] == 2  # 5 <= 5
    assert math.isnan(steps[("0.1", "1", "0")])  # 2 never <= 1
    assert steps[("null", "3", "0")] == 2 and steps[("null", "3", "1")] == 2
    # a missing steps_to_target (never reached) loses against one that reached it
    reach = tidy[tidy["metric"] == "steps_to_target"].set_index(["clip", "layer.scale"])
    assert reach.loc[("0.1", "1"), "wins"] == 0 and reach.loc[("0.1", "1"), "ties"] == 0
    assert reach.loc[("0.1", "1"), "n"] == 0


def test_default_target_leaves_out_diverged_baseline_runs(tmp_path):
    """scale 1: the baseline's seed 0 diverges (NaN at step 3) after a loss of 50, seeds 1 and 2
    end at 3 and 2: the target is 3, not 50. scale 3: every baseline run diverges: no target."""
    curves = {("null", "1"): [[6, 50, math.nan], [6, 5, 4, 3], [6, 5, 4, 2]],
              ("0.1", "1"): [[6, 5, 4, 3]] * 3,
              ("null", "3"): [[6, 50, math.nan]] * 3, ("0.1", "3"): [[6, 5, 4, 1]] * 3}
    for (clip, scale), per_seed in curves.items():
        for seed, losses in enumerate(per_seed):
            write_run(tmp_path / f"{clip}_{scale}_{seed}",
                      [f"clip={clip}", f"layer.scale={scale}", f"seed={seed}"], losses)
    runs_table, tidy = summarize(load_runs(tmp_path)[0], Settings(spike_window=1),
                                   baseline={"clip": "null"})
    rows = runs_table.set_index(["clip", "layer.scale", "seed"])
    assert rows.loc[("null", "1", "0"), "final_loss"] == 50  # before the blow-up
    assert (rows.xs("1", level="layer.scale")["target_loss"] == 3).all()
    assert rows.loc[("0.1", "1", "0"), "steps_to_target"] == 4  # 3 <= 3 at step 4
    assert math.isnan(rows.loc[("null", "1", "0"), "steps_to_target"])  # 6, 50: never
    assert rows.loc[("null", "1", "2"), "steps_to_target"] == 4  # 6, 5, 4 > 3; 2 <= 3
    assert rows.xs("3", level="layer.scale")["target_loss"].isna().all()
    assert rows.xs("3", level="layer.scale")["steps_to_target"].isna().all()
    targets = tidy.set_index(["clip", "layer.scale"])["target_loss"]
    assert targets[("0.1", "1")].iloc[0] == 3 and targets[("0.1", "3")].isna().all()


@pytest.mark.parametrize(("accuracy", "shown"), [
    ({"null": None, "0.1": None}, ["val_loss"]),  # regression
    ({"null": 0.5, "0.1": 0.75}, ["val_accuracy"]),  # classification
    ({"null": 0.5, "0.1": None}, ["val_loss", "val_accuracy"]),  # some groups have one
], ids=["regression", "classification", "mixed"])
def test_printed_validation_metric(tmp_path, accuracy, shown):
    for clip, acc in accuracy.items():
        for seed, val_loss in enumerate([1.0, 3.0]):
            write_run(tmp_path / f"{clip}_{seed}", [f"clip={clip}", f"seed={seed}"],
                      ending_at(1.0), val={10: (val_loss, acc)})
    _, tidy = summarize(load_runs(tmp_path)[0], baseline={"clip": "null"})
    table = group_table(tidy, ["clip"], {"clip": "null"}).set_index("clip")
    assert [c for c in table.columns if c.startswith("val_")] == shown
    assert [c for c in table.columns if c.startswith("Δ val_")] == [f"Δ {c}" for c in shown]
    if "val_loss" in shown:  # 2 ·/÷ exp(t(0.975, 1) · √2 / (2 · √2)) = exp(6.35) = 573
        assert table.loc["0.1", "val_loss"] == "2 (0.0035–1149)"
        assert table.loc["0.1", "Δ val_loss"] == "+0±0 0/2"  # two ties


def test_a_pair_is_won_lost_or_tied_by_hand():
    """Per paired seed, for a lower-is-better and a higher-is-better metric: better wins, worse
    loses, equal ties; a missing value (target never reached) loses to any value, and two
    missing values tie — not a loss, which would move the sign test (0 wins, 1 loss: p stays 1,
    but 0 wins, 3 losses: p = 0.25)."""
    nan, inf = math.nan, math.inf
    pairs = pd.DataFrame({
        "metric": ["final_loss"] * 9 + ["val_accuracy"] * 2,
        # the last three losses: 5e-6 apart relative is more than TIE_RTOL (1e-6, not numpy's
        # 1e-5): a win and a loss; two infinite values tie (and inf − inf warns of nothing)
        "value": [1.0, 2.0, 1.0, nan, 1.0, nan, 100.0, 100.0005, inf, 0.9, 0.8],
        "baseline_value": [2.0, 1.0, 1.0, 1.0, nan, nan, 100.0005, 100.0, inf, 0.8, 0.9]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an exact tie divides nothing by zero either
        win, tie = _wins(pairs)
    assert list(win) == [True, False, False, False, True, False, True, False, False, True, False]
    assert list(tie) == [False, False, True, False, False, True, False, False, True, False, False]


def test_the_summarys_rules_ties_diverged_runs_and_holm(tmp_path):
    """Seeds 0-5. Seed 0: the clipped run's final loss 1e-9 above the baseline's: a tie, not a
    loss. Seed 1: the clipped run diverges: out of final_loss (n 5 of 6), in `diverged`. Seeds
    2-5: the clipped run lower by 0.5: wins. The group's p values, adjusted across its metrics
    by Holm's step-down, are statsmodels' adjustment of the raw ones."""
    from statsmodels.stats.multitest import multipletests

    for seed in range(6):
        base = 1.0 + seed
        clipped = {0: base + 1e-9, 1: math.nan}.get(seed, base - 0.5)
        write_run(tmp_path / f"b{seed}", ["clip=null", f"seed={seed}"], ending_at(base))
        losses = ([2.0, 1.0, math.nan] if math.isnan(clipped) else
                  [clipped + 1.0] * 9 + [clipped])  # final_loss: the last 10% = the last step
        write_run(tmp_path / f"c{seed}", ["clip=0.1", f"seed={seed}"], losses)
    _, tidy = summarize(load_runs(tmp_path)[0], baseline={"clip": "null"})
    group = tidy[tidy["clip"] == "0.1"].set_index("metric")
    final = group.loc["final_loss"]
    assert final["n"] == 5 and final["n_paired"] == 5  # seed 1 diverged: left out
    assert (final["wins"], final["ties"], final["losses"]) == (4, 1, 0)  # 1e-9: a tie
    assert group.loc["diverged", "mean"] == pytest.approx(1 / 6)  # but counted here
    tested = group["sign_p"].dropna()
    assert len(tested) > 3
    np.testing.assert_allclose(group.loc[tested.index, "sign_p_holm"],
                               multipletests(tested.to_numpy(), method="holm")[1])
    assert (group.loc[tested.index, "sign_p_holm"] >= tested).all()


def test_another_model_is_compared_unpaired(tmp_path):
    """model=cnn against model=mlp: seed s of one is no draw of the other's, so no pairs:
    Δ = difference of the means with Welch's interval, Mann-Whitney's two-sided test, and for
    `diverged` Fisher's exact test on the 2x2 counts; no wins or ties."""
    mlp, cnn = [1.0, 2.0, 3.0, 4.0], [2.5, 3.5, 4.5, 9.0]
    for seed, (a, b) in enumerate(zip(mlp, cnn, strict=True)):
        write_run(tmp_path / f"m{seed}", ["model=mlp", f"seed={seed}"], ending_at(a))
        write_run(tmp_path / f"c{seed}", ["model=cnn", f"seed={seed}"], ending_at(b))
    _, tidy = summarize(load_runs(tmp_path)[0], baseline={"model": "mlp"})
    row = tidy[(tidy["model"] == "cnn") & (tidy["metric"] == "final_loss")].iloc[0]
    welch = scipy.stats.ttest_ind(cnn, mlp, equal_var=False).confidence_interval(0.95)
    assert row["diff_mean"] == pytest.approx(np.mean(cnn) - np.mean(mlp))
    assert (row["diff_ci_low"], row["diff_ci_high"]) == pytest.approx((welch.low, welch.high))
    assert row["test"] == "mann-whitney" and row["n_paired"] == 0
    assert row["sign_p"] == pytest.approx(scipy.stats.mannwhitneyu(cnn, mlp).pvalue)
    assert math.isnan(row["wins"]) and math.isnan(row["ties"])
    diverged = tidy[(tidy["model"] == "cnn") & (tidy["metric"] == "diverged")].iloc[0]
    assert diverged["test"] == "fisher" and diverged["sign_p"] == 1.0  # 0/4 against 0/4
    printed = group_table(tidy, ["model"], {"model": "mlp"}).set_index("model")
    assert "(unpaired, p=" in printed.loc["cnn"].to_string()
    assert "unpaired; Δ = difference of the means" in comparison_note({"model": "mlp"},
                                                                       Settings())
    assert "paired by seed" in comparison_note({"clip": "null"}, Settings())
    # an experiment preset may choose its own model: unpaired too
    assert is_unpaired({"experiment": "mnist1d"}) and not is_unpaired({"clip": "null"})


def test_a_runs_own_divergence_factor_and_reported_step_decide_where_it_diverged(tmp_path):
    """Where each run diverged, worked out by hand (steps 1..n): a: its config's
    divergence_factor 2, and 2.5 > 2 · 1 at step 3; b: no factor in its config, so 1000, and
    1000.5 > 1000 · 1 at step 2; c: summary.json says step 3 (its losses never blow up); d:
    summary.json says diverged without a step: its last step, 5; e: never. The measured metrics
    see only the steps before (final_loss: the last of them). No baseline: no target loss; a
    fixed one (2.5) is every run's, whatever the baseline."""
    curve = [4.0, 3.0, 2.0, 1.0, 0.5]
    write_run(tmp_path / "a", ["clip=a"], [1.0, 1.5, 2.5, 1.0, 1.0],
              config={"trainer": {"divergence_factor": 2.0}})
    write_run(tmp_path / "b", ["clip=b"], [1.0, 1000.5, 1.0, 1.0],
              config={"trainer": {"divergence_factor": None}})
    write_run(tmp_path / "c", ["clip=c"], curve, status="diverged",
              summary={"diverged_step": 3})
    write_run(tmp_path / "d", ["clip=d"], curve, status="diverged")
    write_run(tmp_path / "e", ["clip=e"], curve)
    runs, skipped = load_runs(tmp_path)
    assert skipped == [] and runs[3].summary["diverged_step"] is None
    columns = ["diverged", "diverged_step", "final_loss", "target_loss", "steps_to_target"]
    nan = math.nan
    runs_table, _ = summarize(runs)
    expected = pd.DataFrame({"diverged": [1.0, 1.0, 1.0, 1.0, 0.0],
                             "diverged_step": [3.0, 2.0, 3.0, 5.0, nan],
                             "final_loss": [1.5, 1.0, 3.0, 1.0, 0.5],
                             "target_loss": [nan] * 5, "steps_to_target": [nan] * 5},
                            index=pd.Index(list("abcde"), name="run"))
    pd.testing.assert_frame_equal(runs_table.set_index("run")[columns], expected)
    # a fixed target: the first step whose loss (window 1) is at most 2.5, before the divergence
    runs_table, _ = summarize(runs, Settings(spike_window=1, target_loss=2.5),
                              baseline={"clip": "e"})
    expected["target_loss"] = 2.5
    expected["steps_to_target"] = [1.0, 1.0, nan, 3.0, 3.0]  # c: 4, 3 before step 3
    pd.testing.assert_frame_equal(runs_table.set_index("run")[columns], expected)


def test_the_unpaired_comparison_by_hand():
    """compare() on per-seed values written out, against model=mlp (unpaired: every seed of a
    group against every seed of the baseline's). mlp's seeds 0-2 and cnn's 0-1 diverged: out of
    the losses (final_loss n 2 against 2, so Welch's interval and Mann–Whitney), in `diverged`
    (Fisher on [[2, 2], [3, 2]]). Welch and Mann–Whitney need two values on each side (rnn has
    one seed; mlp one val_loss); a side without values (mlp's val_accuracy, rnn's val_loss) is
    no comparison; equal values everywhere (mean_loss) have no interval; a metric without a
    better direction (grad_norm_mean) has its interval but no test. Holm per group."""
    from scipy.stats import fisher_exact, mannwhitneyu, ttest_ind
    from statsmodels.stats.multitest import multipletests

    nan = math.nan
    seeds = {  # per metric: mlp's seeds 0-4, cnn's 0-3, rnn's 0 (9: before a blow-up)
        "diverged": [1, 1, 1, 0, 0] + [1, 1, 0, 0] + [0],
        "final_loss": [9, 9, 9, 0.2, 0.9] + [9, 9, 0.3, 0.5] + [0.4],
        "val_loss": [9, 9, 9, 1.0, nan] + [9, 9, 1.5, 2.5] + [nan],
        "val_accuracy": [nan] * 5 + [nan, nan, 0.5, 0.7] + [0.6],
        "mean_loss": [9, 9, 9, 2.0, 2.0] + [9, 9, 2.0, 2.0] + [3.0],
        "grad_norm_mean": [3, 4, 5, 6, 7] + [1, 2, 3, 4] + [2]}
    index = pd.MultiIndex.from_tuples(
        [("mlp", str(s)) for s in range(5)] + [("cnn", str(s)) for s in range(4)] + [("rnn", "0")],
        names=["model", "seed"])
    per_seed = pd.DataFrame({m: np.array(v, float) for m, v in seeds.items()}, index=index)
    out = compare(per_seed, ["model"], {"model": "mlp"})
    # metric by metric in the table's order, groups in the order they come (unsorted), each
    # with its better direction
    better = out["better"].fillna("none")
    assert list(zip(out["model"], out["metric"], better, strict=True)) == [
        (model, metric, DIRECTIONS[metric] or "none")
        for metric in seeds for model in ("mlp", "cnn", "rnn")]
    assert list(out.columns) == [
        "model", "metric", "better", "n", "mean", "std", "ci_low", "ci_high", "baseline",
        "n_paired", "n_diff", "diff_mean", "diff_ci_low", "diff_ci_high", "test", "sign_p",
        "sign_p_holm"]
    welch = {m: ttest_ind(g, b, equal_var=False).confidence_interval(0.95)
             for m, g, b in (("final_loss", [0.3, 0.5], [0.2, 0.9]),
                             ("grad_norm_mean", [1, 2, 3, 4], [3, 4, 5, 6, 7]))}
    p = {("cnn", "diverged"): fisher_exact([[2, 2], [3, 2]]).pvalue,
         ("cnn", "final_loss"): mannwhitneyu([0.3, 0.5], [0.2, 0.9]).pvalue,
         ("cnn", "mean_loss"): mannwhitneyu([2.0, 2.0], [2.0, 2.0]).pvalue,
         ("rnn", "diverged"): fisher_exact([[0, 1], [3, 2]]).pvalue}
    holm = {**dict(zip([k for k in p if k[0] == "cnn"], multipletests(
        [v for k, v in p.items() if k[0] == "cnn"], method="holm")[1], strict=True)),
            ("rnn", "diverged"): p[("rnn", "diverged")]}
    # (n_diff, diff_mean, diff_ci_low, diff_ci_high, test); no comparison: None
    expected = {
        ("cnn", "diverged"): (4, 0.5 - 0.6, nan, nan, "fisher"),
        ("cnn", "final_loss"): (2, 0.4 - 0.55, welch["final_loss"].low,
                                welch["final_loss"].high, "mann-whitney"),
        ("cnn", "val_loss"): (2, 2.0 - 1.0, nan, nan, ""),
        ("cnn", "val_accuracy"): None,
        ("cnn", "mean_loss"): (2, 0.0, nan, nan, "mann-whitney"),
        ("cnn", "grad_norm_mean"): (4, 2.5 - 5.0, welch["grad_norm_mean"].low,
                                    welch["grad_norm_mean"].high, ""),
        ("rnn", "diverged"): (1, 0.0 - 0.6, nan, nan, "fisher"),
        ("rnn", "final_loss"): (1, 0.4 - 0.55, nan, nan, ""),
        ("rnn", "val_loss"): None, ("rnn", "val_accuracy"): None,
        ("rnn", "mean_loss"): (1, 3.0 - 2.0, nan, nan, ""),
        ("rnn", "grad_norm_mean"): (1, 2.0 - 5.0, nan, nan, "")}
    columns = ["baseline", "n_paired", "n_diff", "diff_mean", "diff_ci_low", "diff_ci_high",
               "test", "sign_p", "sign_p_holm"]
    rows = out.set_index(["model", "metric"])
    for key, cells in expected.items():
        got = rows.loc[key, columns]
        if cells is None:
            assert got.isna().all(), (key, got)
        else:
            want = ["model=mlp", 0, *cells, p.get(key, nan), holm.get(key, nan)]
            assert list(got) == pytest.approx(want, nan_ok=True), (key, list(got), want)
    assert rows.loc[("mlp", "final_loss"), columns].isna().all()
    # a baseline key of another model, dataset or experiment, also a key inside one
    assert is_unpaired({"model.width": "32"}) and is_unpaired({"dataset.noise": "0.1"})


def test_group_counts_by_hand():
    """Per group, in the order the groups come: runs; completed (finished, not diverged);
    diverged (by its status or by its table, even while running), not failed; failed; incomplete
    (running, interrupted or without summary.json, not diverged). Whole counts."""
    nan = math.nan
    rows = [("b", "completed", 0), ("b", "completed", 0), ("b", "diverged", 1),
            ("b", "running", 0), ("b", "running", 0), ("b", "failed", nan),
            ("b", "unknown", 0), ("b", "completed", 1), ("b", "running", 1),
            ("b", "interrupted", 0), ("a", "completed", 0)]
    runs_table = pd.DataFrame(rows, columns=["clip", "status", "diverged"])
    expected = pd.DataFrame({"runs": [10, 1], "completed": [2, 1], "diverged": [3, 0],
                             "failed": [1, 0], "incomplete": [4, 0]},
                            index=pd.Index(["b", "a"], name="clip"))
    pd.testing.assert_frame_equal(group_counts(runs_table, ["clip"]), expected)


def test_the_paired_comparison_by_hand():
    """compare() on per-seed values written out, against clip=null, seed by seed. clip=0.1 has
    seeds 0-2; its seed 1 and null's seed 2 diverged: out of final_loss and val_accuracy (one
    pair left, seed 0), in `diverged` (seed 0 a tie, 1 a loss, 2 a win: no t interval on 0/1
    values). grad_norm_mean has no better direction: its interval, no wins, ties or test."""
    from scipy.stats import binomtest

    nan = math.nan
    seeds = {  # per metric: null's seeds 0-3, 0.1's 0-2 (9: before a blow-up)
        "diverged": [0, 0, 1, 0] + [0, 1, 0],
        "final_loss": [2.0, 3.0, 9, 4.0] + [1.0, 9, 2.5],
        "val_accuracy": [0.5, 0.5, 9, 0.7] + [0.6, 9, 0.4],
        "grad_norm_mean": [1, 2, 3, 4] + [2, 2, 2]}
    index = pd.MultiIndex.from_tuples(
        [("null", str(s)) for s in range(4)] + [("0.1", str(s)) for s in range(3)],
        names=["clip", "seed"])
    per_seed = pd.DataFrame({m: np.array(v, float) for m, v in seeds.items()}, index=index)
    out = compare(per_seed, ["clip"], {"clip": "null"})
    columns = ["baseline", "n_paired", "n_diff", "diff_mean", "wins", "ties", "diff_ci_low",
               "diff_ci_high", "losses", "win_rate", "sign_p", "test", "sign_p_holm"]
    assert list(out.columns) == ["clip", "metric", "better", "n", "mean", "std", "ci_low",
                                 "ci_high", *columns]
    one = binomtest(1, 1).pvalue  # one win of one pair
    low, high = t_interval([1.0, 0.0, -1.0])
    expected = {  # (n_paired, n_diff, diff_mean, wins, ties, ci low, ci high, losses, win_rate,
        # sign_p, test); Holm: every p is 1
        "diverged": (3, 3, 0.0, 1, 1, nan, nan, 1, 1 / 3, binomtest(1, 2).pvalue, "sign"),
        "final_loss": (1, 1, -1.0, 1, 0, nan, nan, 0, 1.0, one, "sign"),
        "val_accuracy": (1, 1, 0.1, 1, 0, nan, nan, 0, 1.0, one, "sign"),
        "grad_norm_mean": (3, 3, 0.0, nan, nan, low, high, nan, nan, nan, "")}
    rows = out.set_index(["clip", "metric"])
    for metric, cells in expected.items():
        got = rows.loc[("0.1", metric), columns]
        want = ["clip=null", *cells, 1.0 if cells[-1] else nan]
        assert list(got) == pytest.approx(want, nan_ok=True), (metric, list(got), want)
        assert rows.loc[("null", metric), columns].isna().all()


def test_a_group_of_failed_runs_only_keeps_its_rows_and_prints_its_count(tmp_path):
    """clip=0.1's only run failed: nothing measured, yet the summary has its row for every
    metric (n 0, the metric's better direction, its counts), and the printed table its line."""
    from gradexp.analysis.metrics import METRICS

    for seed in range(2):
        write_run(tmp_path / f"n{seed}", ["clip=null", f"seed={seed}"], ending_at(1.0 + seed))
    write_run(tmp_path / "f0", ["clip=0.1", "seed=0"], [4.0, 3.0], status="failed",
              summary={"error": "ValueError: boom"})
    _, tidy = summarize(load_runs(tmp_path)[0], baseline={"clip": "null"})
    failed = tidy[tidy["clip"] == "0.1"]
    assert list(failed["metric"]) == list(METRICS)
    assert list(failed["better"].fillna("none")) == [d or "none" for d in METRICS.values()]
    assert failed["n"].dtype == np.int64 and (failed["n"] == 0).all()
    assert (failed[["runs", "failed", "completed", "diverged", "incomplete"]].to_numpy()
            == [1, 1, 0, 0, 0]).all()
    printed = group_table(tidy, ["clip"], {"clip": "null"}).set_index("clip")
    shown = ["diverged", "final_loss", "val_loss", "loss_spike_rate", "loss_spike_score",
             "grad_norm_spike_score", "grad_norm_cv", "steps_to_target"]
    assert list(printed.columns) == ["runs", *(c for m in shown for c in (m, f"Δ {m}")),
                                     "clip_fraction", "notes"]
    assert printed.loc["0.1"].to_dict() == {
        "runs": 1, **{c: "no pair" if c.startswith("Δ") else "—" for c in printed.columns[1:-1]},
        "notes": "1 failed"}
