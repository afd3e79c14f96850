"""gradexp.analysis.metrics: each per-run metric against numbers worked out by hand on small
hand-written runs (fake_runs.write_run), and the divergence that bounds the steps measured."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from fake_runs import FRACTIONS, LOSSES, NORMS, VAL, write_run

from gradexp.analysis import compare
from gradexp.analysis.compare import summarize
from gradexp.analysis.metrics import (
    Settings,
    clip_fraction,
    final_loss,
    grad_norm_cv,
    grad_norm_p99_p50,
    loss_spike_rate,
    loss_spikes,
    run_metrics,
    spike_score,
    steps_to_target,
    table_divergence_step,
    trailing_mean,
)
from gradexp.analysis.reports import group_table
from gradexp.analysis.runs import load_runs, read_metrics


def table_of(run_dir):
    return read_metrics(run_dir / "metrics.csv")


def test_metrics_of_one_run(tmp_path):
    run = write_run(tmp_path / "r", ["clip=0.1"], LOSSES, norms=NORMS, fractions=FRACTIONS,
                    val=VAL)
    table = table_of(run)
    m = run_metrics(table, Settings(final_fraction=0.3, spike_factor=2, spike_window=3),
                      target_loss=1.5)
    assert m["diverged"] == 0 and math.isnan(m["diverged_step"])
    assert m["final_loss"] == pytest.approx((0.5 + 2.5 + 0.6) / 3)  # last 3 of 10 steps
    assert m["mean_loss"] == pytest.approx(25.1 / 10)
    # window 3, factor 2: step 4 (8 > 2·mean(4,3,2) = 6) and step 9 (2.5 > 2·mean(1,0.5,1) = 2)
    assert m["loss_spikes"] == 2 and m["measured_steps"] == 10
    assert m["loss_spike_rate"] == pytest.approx(100 * 2 / 10)  # per 100 measured steps
    # trailing means over 3 steps: 4, 3.5, 3, 4.33, 4, 3.83, 1.5 (step 7) <= 1.5
    assert m["steps_to_target"] == 7
    # norms: mean 5, population variance (9+1+1+1+0+0+4+16+0+0)/10 = 3.2
    assert m["grad_norm_mean"] == 5 and m["grad_norm_max"] == 9
    assert m["grad_norm_cv"] == pytest.approx(math.sqrt(3.2) / 5)
    # sorted 2,4,4,4,5,5,5,5,7,9: p50 = 5; p99 at rank 0.99·9 = 8.91: 7 + 0.91·(9 − 7) = 8.82
    assert m["grad_norm_p99_p50"] == pytest.approx(8.82 / 5)
    assert m["clip_fraction"] == pytest.approx((0.1 + 0.25) / 2)  # dense_1 0.1, dense_2 0.25
    assert (m["val_loss"], m["val_accuracy"]) == (1.0, 0.75)  # the last evaluation, step 10
    assert math.isnan(m["param_clip_fraction"])  # no param_clip/clipped column
    # over k ≤ 10 values no value is √(k − 1) ≤ 3 < 7 standard deviations from their mean
    assert m["loss_spike_score"] == 0 and m["grad_norm_spike_score"] == 0


def test_default_settings_and_edge_values():
    loss = pd.Series(LOSSES, dtype=float)
    assert final_loss(loss) == 0.6  # last max(1, ⌊0.1·10⌋) = 1 step
    assert final_loss(pd.Series([1.0, 2, 3])) == 3  # at least one step
    assert final_loss(pd.Series(np.arange(30.0)), 0.1) == 28  # ⌊0.1·30⌋ = 3, not 2
    # window 20: step 9 compares with the mean of steps 1..8 = 22/8 = 2.75: no spike
    assert loss_spikes(loss) == 1
    # twice the trailing mean, but a rise of 0.009 < 0.05 × the first loss: noise, not a spike
    tiny = np.array([1.0, 0.001, 0.001, 0.01])
    assert loss_spikes(tiny, window=2) == 0 and loss_spikes(tiny, window=2, min_rise=0) == 1
    assert loss_spike_rate(tiny, window=2, min_rise=0) == 25  # 1 spike in 4 steps
    steps = pd.Series(range(1, 11))
    assert steps_to_target(loss, steps, 1.4, window=3) == 8  # (1.5 + 1 + 0.5) / 3 = 1
    assert steps_to_target(loss, steps, 0.5, window=1) == 8
    assert math.isnan(steps_to_target(loss, steps, 0.1, window=3))  # never reached
    assert clip_fraction(pd.DataFrame({"loss/train": [1.0]})) == 0  # no clip layer


def test_trailing_mean_over_the_values_that_exist():
    # window 2: 2, (2+4)/2, (4+6)/2, (6+8)/2; window 5 > n: the mean of all so far
    assert trailing_mean(np.array([2.0, 4, 6, 8]), 2) == pytest.approx([2, 3, 5, 7])
    assert trailing_mean(np.array([2.0, 4, 6, 8]), 5) == pytest.approx([2, 3, 4, 5])


def test_the_default_spike_window_factor_and_rise():
    """Defaults window 20, factor 2, min_rise 0.05: after a first loss of 11, twenty losses of
    1, then 2.5 at step 22. Its trailing mean over the 20 steps before it is 1 (2.5 > 2: a
    spike, rising 1.5 > 0.05 · 11); over 21 steps it would be 31/21 (2.5 < 2.95: none), with
    factor 3 none, with min_rise 1.05 none (1.5 < 11.55)."""
    loss = np.array([11.0] + [1.0] * 20 + [2.5])
    assert loss_spikes(loss) == 1
    assert loss_spike_rate(loss) == pytest.approx(100 / 22)
    assert loss_spikes(loss, window=21) == 0 and loss_spikes(loss, factor=3) == 0
    assert loss_spikes(loss, min_rise=1.05) == 0 and loss_spike_rate(loss, window=21) == 0
    # steps_to_target's default window is 20 too: after a first loss of 41, thirty losses of
    # 1: the mean of the last 20 is 1 at step 21 (over 21 steps: (41 + 20)/21 at step 21)
    assert steps_to_target(np.array([41.0] + [1.0] * 30), np.arange(1, 32), 1.0) == 21


def test_a_spike_is_strictly_above_both_thresholds():
    # window 2, factor 2: 2 is exactly twice the mean (1) of the two losses before it: no spike
    assert loss_spikes(np.array([1.0, 1, 2]), window=2) == 0
    assert loss_spikes(np.array([1.0, 1, 2.01]), window=2) == 1
    # window 1: 0.75 > 2 · 0.25, but its rise 0.5 is not above 0.5 · the first loss (1)
    assert loss_spikes(np.array([1.0, 0.25, 0.75]), window=1, min_rise=0.5) == 0
    assert loss_spikes(np.array([1.0, 0.25, 0.75]), window=1, min_rise=0.49) == 1


def test_the_rise_is_the_loss_minus_the_mean_relative_to_the_first_loss():
    # window 2, the mean before step 4 is 0.01: 0.045 is 4.5× it but rises only 0.035, not
    # above 0.05 · 1 (its loss plus the mean, 0.055, would be)
    assert loss_spikes(np.array([1.0, 0.01, 0.01, 0.045]), window=2) == 0
    # a first loss of 2: 0.08 rises 0.07, not above 0.05 · 2 = 0.1 (0.05 / 2 = 0.025 it is)
    assert loss_spikes(np.array([2.0, 0.01, 0.01, 0.08]), window=2) == 0
    assert loss_spikes(np.array([2.0, 0.01, 0.01, 0.12]), window=2) == 1  # rise 0.11 > 0.1


def test_gradient_norm_ratios_by_hand_and_nan_quietly_at_zero():
    # norms below 1: std 0.1 / mean 0.3; p99 of 0.1, 0.2, 0.3 at rank 1.98: 0.298, p50 0.2
    assert grad_norm_cv(np.array([0.2, 0.4])) == pytest.approx(1 / 3)
    assert grad_norm_p99_p50(np.array([0.1, 0.2, 0.3])) == pytest.approx(0.298 / 0.2, rel=1e-12)
    # a zero mean or median: NaN, without numpy's division warnings reaching the user
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert math.isnan(grad_norm_cv(np.zeros(3)))
        assert math.isnan(grad_norm_p99_p50(np.array([0.0, 0, 0, 4])))  # p99 3.88, p50 0


def test_a_table_without_gradient_norms_diverges_by_its_loss_alone():
    table = pd.DataFrame({"step": [10, 20, 30], "loss/train": [1.0, 2.0, math.nan]})
    assert table_divergence_step(table, 1000) == 30
    assert table_divergence_step(table, 1.5) == 20  # 2 > 1.5 · 1
    assert table_divergence_step(table, 1000, reported_step=15) == 15  # the earlier of the two


def test_a_non_finite_norm_on_a_step_the_loss_scale_optimizer_skipped_is_no_divergence():
    table = pd.DataFrame({"step": [1, 2, 3], "loss/train": [1.0, 1.0, 1.0],
                          "grad_norm/global": [1.0, math.inf, 1.0], "skipped": [0.0, 1.0, 0.0]})
    assert math.isnan(table_divergence_step(table, 1000))  # skipped: only the scale drops
    assert table_divergence_step(table.drop(columns="skipped"), 1000) == 2


def test_run_metrics_defaults_and_settings():
    # the default divergence factor is 1000: a loss 1000.5 times the first diverges
    rising = pd.DataFrame({"step": [1, 2], "loss/train": [1.0, 1000.5]})
    assert run_metrics(rising)["diverged"] == 1 and run_metrics(rising)["diverged_step"] == 2
    assert run_metrics(rising, divergence_factor=1001)["diverged"] == 0
    # without a gradient-norm column its metrics are NaN (not an error)
    m = run_metrics(pd.DataFrame({"step": [1, 2, 3], "loss/train": [3.0, 2.0, 1.0]}))
    assert math.isnan(m["grad_norm_mean"]) and math.isnan(m["grad_norm_max"])
    assert m["final_loss"] == 1 and m["measured_steps"] == 3
    # the spike score's window and sigmas come from Settings: of ten values, the last is 100
    # after nine 1s, √9 = 3 standard deviations from their mean: a spike at 2σ, none at 7σ
    values = [1.0] * 9 + [100.0]
    table = pd.DataFrame({"step": range(1, 11), "loss/train": values,
                          "grad_norm/global": values})
    scores = ("loss_spike_score", "grad_norm_spike_score")
    at_2 = run_metrics(table, Settings(spike_score_sigmas=2.0))
    assert [at_2[k] for k in scores] == [10, 10]  # one in ten values, in percent
    assert [run_metrics(table)[k] for k in scores] == [0, 0]
    # a window of 3: 100 is √2 σ from the mean of (1, 1, 100): none at 2σ
    at_2_over_3 = run_metrics(table, Settings(spike_score_window=3, spike_score_sigmas=2.0))
    assert [at_2_over_3[k] for k in scores] == [0, 0]


def alternating(n):
    """1.01, 0.99, 1.01, ...: each value is (at most) 1σ from the mean of the values up to it
    (over an even number of them: mean 1, standard deviation 0.01)."""
    return 1 + 0.01 * (-1.0) ** np.arange(n)


def test_spike_score_by_hand():
    """OLMo 2's spike score: the percentage of values ≥ 7σ from the rolling mean of the last
    1000 (the value included). Two outliers in 3000 values: 2/3000 · 100; one below the mean
    counts too (|x − m|); 1200 steps apart, neither is in the other's window."""
    x = alternating(3000)
    x[1499] += 1  # step 1500, 1.99: window 501..1500 has mean 1.001, std 0.0328: z = 30.1
    x[2699] -= 1  # step 2700, −0.01: window 1701..2700, mean 0.999, std 0.0335: z = −30.2
    assert spike_score(x) == pytest.approx(100 * 2 / 3000)
    assert spike_score(alternating(3000)) == 0  # every value 1σ from the mean: none
    assert spike_score(x, sigmas=31) == 0  # the threshold is a setting
    assert math.isnan(spike_score(np.array([1.0, math.nan, 1.0])))  # e.g. no grad-norm column


def test_spike_score_counts_a_value_only_at_least_sigmas_away():
    """The same step 1500 of an alternating series: 1.06 is 5.9σ from its window's mean
    (1.00007, std 0.01017), not a spike; 1.08 is 7.75σ (1.00009, 0.01031), one in 2000."""
    below, above = alternating(2000), alternating(2000)
    below[1499], above[1499] = 1.06, 1.08
    assert spike_score(below) == 0
    assert spike_score(above) == 100 / 2000
    assert spike_score(below, sigmas=5.5) == 100 / 2000 and spike_score(above, sigmas=8) == 0


def test_spike_score_of_a_run_shorter_than_the_window():
    """Before `window` values exist the rolling statistics are over the values so far. k − 1
    equal values and one other: that one is exactly √(k − 1) standard deviations from the
    mean, whatever its size, so at 7σ no value among the first 49 can count: step 49 is
    √48 = 6.93σ away, step 51 √50 = 7.07σ (one spike in 60 values)."""
    early, late = np.ones(60), np.ones(60)
    early[48], late[50] = 100.0, 100.0
    assert spike_score(early) == 0
    assert spike_score(late) == pytest.approx(100 / 60)
    assert spike_score(late, window=10) == 0  # a window of 10: never more than 3σ


def test_spike_score_at_exactly_sigmas_the_default_window_and_a_window_of_one():
    """Step 50 of fifty values, 49 equal and one other, is exactly √49 = 7 population standard
    deviations from their mean (7.0 in floating point too): it counts (≥, and ddof=0: with
    ddof=1 it would be 6.93σ). The default window is 1000: a first value of 1000 leaves the
    window at step 1001, where 1.1 is then ~9.5σ above the alternating 1 ± 0.01 (over 1001
    values it would be within 1σ). A window of one value: never a spike."""
    x = np.ones(60)
    x[49] = 100.0
    assert spike_score(x) == pytest.approx(100 / 60)
    far = alternating(1001)
    far[0], far[1000] = 1000.0, 1.1
    assert spike_score(far) == pytest.approx(100 / 1001)
    assert spike_score(far, window=1001) == 0
    assert spike_score(x, window=1) == 0


@pytest.mark.parametrize(("losses", "norms", "factor", "step"), [
    ([2, 1, 1, 25], None, 10, 4),           # 25 > 10 · 2: diverged by factor
    ([2, 1, 1, 25], None, 1000, math.nan),  # the same losses under the default factor
    ([2, 1.5, 1, math.nan], None, 1000, 4),  # a NaN loss
    ([2, 1.5, 1, math.inf], None, 1000, 4),
    ([2, 1.5, 1, 1], [1, 1, math.inf, 1], 1000, 3),  # an infinite gradient norm
    ([math.nan, 1, 1, 1], None, 1000, 1),
], ids=["factor", "under-default-factor", "nan", "inf", "grad-norm", "first-step"])
def test_divergence(tmp_path, losses, norms, factor, step):
    run = write_run(tmp_path / "r", [], losses, norms=norms,
                    config={"trainer": {"divergence_factor": factor}})
    (loaded,), _ = load_runs(run)
    m = run_metrics(loaded.metrics, divergence_factor=compare._divergence_factor(loaded))
    assert m["diverged_step"] == step or (math.isnan(step) and math.isnan(m["diverged_step"]))
    assert m["diverged"] == (not math.isnan(step))
    # loss-based metrics use only the steps before the divergence
    finite = losses[: int(step) - 1] if not math.isnan(step) else losses
    if finite:
        assert m["mean_loss"] == pytest.approx(np.mean(finite))
    else:  # diverged at its first step: nothing to measure (no spikes is not "0 spikes")
        assert math.isnan(m["mean_loss"]) and math.isnan(m["final_loss"])
        assert math.isnan(m["loss_spikes"]) and math.isnan(m["grad_norm_cv"])
        assert math.isnan(m["loss_spike_rate"]) and m["measured_steps"] == 0


def test_spike_rate_counts_only_the_steps_before_divergence(tmp_path):
    """One spike (step 3: 4 > 2 · mean(1, 1)) in the 4 steps before a NaN at step 5: 25 per 100
    steps; the same spike in a run of 100 finite steps: 1 per 100."""
    write_run(tmp_path / "short", [], [1, 1, 4, 1, math.nan])
    write_run(tmp_path / "long", [], [1, 1, 4] + [1] * 97)
    runs_table, _ = summarize(load_runs(tmp_path)[0])
    rows = runs_table.set_index("run")
    assert rows.loc["short", ["loss_spikes", "measured_steps", "loss_spike_rate"]].tolist() == [
        1, 4, 25]
    assert rows.loc["long", ["loss_spikes", "measured_steps", "loss_spike_rate"]].tolist() == [
        1, 100, 1]


def test_reported_divergence_counts_even_when_the_rows_look_fine(tmp_path):
    run = write_run(tmp_path / "r", [], [2, 1, 1, 1], status="diverged",
                    summary={"diverged_step": 3})
    (loaded,), _ = load_runs(run)
    m = run_metrics(loaded.metrics, reported_diverged_step=compare._reported_step(loaded))
    assert m["diverged_step"] == 3 and m["mean_loss"] == 1.5


def test_param_clip_fraction(tmp_path):
    """The share of steps whose parameter gradients were clipped, over the steps before the
    divergence: clipped 1, 1, 0, 0 before the NaN at step 5: 0.5; printed when logged."""
    for seed in range(2):
        write_run(tmp_path / f"none_{seed}", ["clipping=none", f"seed={seed}"], [2, 1, 1, 1, 1],
                  columns={"param_clip/clipped": [0] * 5})
        write_run(tmp_path / f"agc_{seed}", ["clipping=agc", f"seed={seed}"],
                  [2, 1, 1, 1, math.nan], columns={"param_clip/clipped": [1, 1, 0, 0, 1]})
    runs_table, tidy = summarize(load_runs(tmp_path)[0], baseline={"clipping": "none"})
    assert runs_table.set_index("run").loc["agc_0", "param_clip_fraction"] == 0.5
    row = tidy[tidy["metric"] == "param_clip_fraction"].set_index("clipping").loc["agc"]
    assert row["mean"] == 0.5 and row["diff_mean"] == 0.5 and math.isnan(row["win_rate"])
    table = group_table(tidy, ["clipping"], {"clipping": "none"}).set_index("clipping")
    assert table.loc["agc", "param_clip_fraction"] == "0.5±0"
    assert "Δ param_clip_fraction" not in table  # no "better" direction
    # runs without the column: NaN, and no column in the printed table
    (tmp_path / "old").mkdir()
    write_run(tmp_path / "old" / "a", ["clip=null"], [2, 1])
    write_run(tmp_path / "old" / "b", ["clip=0.1"], [2, 1])
    _, tidy = summarize(load_runs(tmp_path / "old")[0], baseline={"clip": "null"})
    assert "param_clip_fraction" not in group_table(tidy, ["clip"], {"clip": "null"})


def test_spike_skipped_steps_count_the_skips_before_the_divergence_and_are_compared(tmp_path):
    """Σ spike_skipped over the steps before the divergence (1 + 1 + 0 + 1 before the NaN at 5:
    3), NaN for a run that did not skip; compared with the baseline seed by seed (fewer: a win)
    and printed only when some run logged it."""
    for seed in range(2):
        write_run(tmp_path / f"none_{seed}", ["trainer.on_spike=none", f"seed={seed}"],
                  [2, 1, 1, 1, 1], columns={"spike_skipped": [0, 0, 0, 0, 0]})
        write_run(tmp_path / f"skip_{seed}", ["trainer.on_spike=skip", f"seed={seed}"],
                  [2, 1, 1, 1, math.nan], columns={"spike_skipped": [1, 1, 0, 1, 1]})
    runs_table, tidy = summarize(load_runs(tmp_path)[0],
                                 baseline={"trainer.on_spike": "none"})
    assert runs_table.set_index("run").loc["skip_0", "spike_skipped_steps"] == 3
    row = tidy[tidy["metric"] == "spike_skipped_steps"].set_index("trainer.on_spike").loc["skip"]
    assert row["mean"] == 3 and row["diff_mean"] == 3 and row["losses"] == 2
    table = group_table(tidy, ["trainer.on_spike"], {"trainer.on_spike": "none"})
    assert "spike_skipped_steps" in table
    (tmp_path / "old").mkdir()
    write_run(tmp_path / "old" / "a", ["clip=null"], [2, 1])
    write_run(tmp_path / "old" / "b", ["clip=0.1"], [2, 1])
    runs_table, tidy = summarize(load_runs(tmp_path / "old")[0], baseline={"clip": "null"})
    assert math.isnan(runs_table["spike_skipped_steps"].iloc[0])
    assert "spike_skipped_steps" not in group_table(tidy, ["clip"], {"clip": "null"})
