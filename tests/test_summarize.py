"""summarize: metrics checked against numbers worked out by hand on small hand-written runs,
unreadable runs skipped with a reason, the event-file fallback, the CLI, and one real sweep."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import yaml

from conftest import REPO, gradexp
from gradexp import summarize as S

# A run of 10 steps whose metrics are worked out by hand in test_metrics_of_one_run.
LOSSES = [4, 3, 2, 8, 2, 1.5, 1, 0.5, 2.5, 0.6]
NORMS = [2, 4, 4, 4, 5, 5, 7, 9, 5, 5]
FRACTIONS = {"dense_1": [0.1] * 10, "dense_2": [0.0] * 5 + [0.5] * 5}
VAL = {5: (2.0, 0.5), 10: (1.0, 0.75)}  # step: (loss/val, accuracy/val)


def _field(value) -> str:
    return "" if value is None else str(value)  # str(nan) is "nan", as the trainer writes it


def write_run(run_dir, overrides, losses, *, norms=None, fractions=None, val=None,
              status="completed", summary=None, config=None, columns=None):
    """A run directory as gradexp.train leaves it: .hydra/, metrics.csv, summary.json;
    `columns`: more per-step columns, {name: values}."""
    cfg = {"clip": None, "seed": 0, "model": {"name": "mlp", "width": 16},
           "clipping": {"name": "none"}, "layer": {"scale": 1.0},
           "trainer": {"steps": len(losses), "divergence_factor": 1000.0}}
    for override in overrides:  # as Hydra composes them (enough for these tests)
        key, _, value = override.lstrip("+").partition("=")
        if key == "experiment":  # a preset (`# @package _global_`) is no node of the config
            continue
        node, *path = [cfg, *key.split(".")]
        for part in path[:-1]:
            node = node.setdefault(part, {})
        if isinstance(node.get(path[-1]), dict):  # a config group: model=mlp picks a node
            node[path[-1]]["name"] = value
        else:
            node[path[-1]] = yaml.safe_load(value)
    for key, value in (config or {}).items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    n = len(losses)
    norms = norms if norms is not None else [1.0] * n
    fractions = fractions or {"dense_1": [0.0] * n}
    val = val or {}
    columns = columns or {}
    header = ["step", "loss/train", "grad_norm/global", "learning_rate", *columns]
    for p in fractions:
        header += [f"grad_norm/{p}/pre", f"grad_norm/{p}/post", f"clip_fraction/{p}"]
    lines = [",".join([*header, "loss/val", "accuracy/val"])]
    for i in range(n):
        row = [i + 1, float(losses[i]), float(norms[i]), 0.001, *(c[i] for c in columns.values())]
        for f in fractions.values():
            row += [1.0, 1.0 - f[i], f[i]]
        row += list(val.get(i + 1, (None, None)))
        lines.append(",".join(map(_field, row)))
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({
        "status": status, "diverged": status == "diverged", "diverged_step": None, "steps": n,
        "config": cfg, "overrides": list(overrides), **(summary or {})}))
    return run_dir


def table_of(run_dir):
    return S.read_metrics(run_dir / "metrics.csv")


# ---------------------------------------------------------------------------------------------
# Per-run metrics against hand-computed values


def test_metrics_of_one_run(tmp_path):
    run = write_run(tmp_path / "r", ["clip=0.1"], LOSSES, norms=NORMS, fractions=FRACTIONS,
                    val=VAL)
    table = table_of(run)
    m = S.run_metrics(table, S.Settings(final_fraction=0.3, spike_factor=2, spike_window=3),
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


def test_default_settings_and_edge_values():
    loss = pd.Series(LOSSES, dtype=float)
    assert S.final_loss(loss) == 0.6  # last max(1, ⌊0.1·10⌋) = 1 step
    assert S.final_loss(pd.Series([1.0, 2, 3])) == 3  # at least one step
    assert S.final_loss(pd.Series(np.arange(30.0)), 0.1) == 28  # ⌊0.1·30⌋ = 3, not 2
    # window 20: step 9 compares with the mean of steps 1..8 = 22/8 = 2.75: no spike
    assert S.loss_spikes(loss) == 1
    # twice the trailing mean, but a rise of 0.009 < 0.05 × the first loss: noise, not a spike
    tiny = np.array([1.0, 0.001, 0.001, 0.01])
    assert S.loss_spikes(tiny, window=2) == 0 and S.loss_spikes(tiny, window=2, min_rise=0) == 1
    assert S.loss_spike_rate(tiny, window=2, min_rise=0) == 25  # 1 spike in 4 steps
    steps = pd.Series(range(1, 11))
    assert S.steps_to_target(loss, steps, 1.4, window=3) == 8  # (1.5 + 1 + 0.5) / 3 = 1
    assert S.steps_to_target(loss, steps, 0.5, window=1) == 8
    assert math.isnan(S.steps_to_target(loss, steps, 0.1, window=3))  # never reached
    assert S.clip_fraction(pd.DataFrame({"loss/train": [1.0]})) == 0  # no clip layer


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
    (loaded,), _ = S.load_runs(run)
    m = S.run_metrics(loaded.metrics, divergence_factor=S._divergence_factor(loaded))
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
    runs_table, _ = S.summarize(S.load_runs(tmp_path)[0])
    rows = runs_table.set_index("run")
    assert rows.loc["short", ["loss_spikes", "measured_steps", "loss_spike_rate"]].tolist() == [
        1, 4, 25]
    assert rows.loc["long", ["loss_spikes", "measured_steps", "loss_spike_rate"]].tolist() == [
        1, 100, 1]


def test_reported_divergence_counts_even_when_the_rows_look_fine(tmp_path):
    run = write_run(tmp_path / "r", [], [2, 1, 1, 1], status="diverged",
                    summary={"diverged_step": 3})
    (loaded,), _ = S.load_runs(run)
    m = S.run_metrics(loaded.metrics, reported_diverged_step=S._reported_step(loaded))
    assert m["diverged_step"] == 3 and m["mean_loss"] == 1.5


# ---------------------------------------------------------------------------------------------
# Groups, matching baselines, paired differences, intervals, win rates


def ending_at(final: float, n: int = 10) -> list[float]:
    """A loss curve of n steps from 4 down to `final` (final_loss = final with the defaults)."""
    return [4.0] * (n - 1) + [final]


def t_interval(values):
    """scipy's 95% Student-t interval of the mean of `values`."""
    return scipy.stats.t.interval(0.95, len(values) - 1, loc=np.mean(values),
                                  scale=scipy.stats.sem(values))


def test_paired_differences_interval_and_win_rate(tmp_path):
    base, clipped = [1.0, 2.0, 3.0], [0.5, 2.5, 2.0, 9.0]  # final losses per seed
    for seed, final in enumerate(base):
        write_run(tmp_path / f"b{seed}", ["clip=null", f"seed={seed}"], ending_at(final))
    for seed, final in enumerate(clipped):  # seed 3 has no baseline run: not paired
        write_run(tmp_path / f"c{seed}", ["clip=0.1", f"seed={seed}"], ending_at(final))
    runs, skipped = S.load_runs(tmp_path)
    assert len(runs) == 7 and skipped == []
    _, tidy = S.summarize(runs, baseline={"clip": "null"})
    row = tidy[(tidy["clip"] == "0.1") & (tidy["metric"] == "final_loss")].iloc[0]
    assert row["n"] == 4 and row["mean"] == pytest.approx(np.mean(clipped))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(t_interval(clipped))
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


def test_clopper_pearson_and_sign_test_by_hand():
    # k = 0 and k = n have closed forms: 1 − 0.025^(1/n) and 0.025^(1/n)
    assert S.clopper_pearson(0, 5) == pytest.approx((0, 1 - 0.025 ** (1 / 5)))  # (0, 0.5218)
    assert S.clopper_pearson(5, 5) == pytest.approx((0.025 ** (1 / 5), 1))  # (0.4782, 1)
    low, high = S.clopper_pearson([4, 2], [5, 5])
    assert low == pytest.approx(scipy.stats.beta.ppf(0.025, [4, 2], [2, 4]))  # 0.2836, 0.0527
    assert high == pytest.approx(scipy.stats.beta.ppf(0.975, [5, 3], [1, 3]))  # 0.9949, 0.8534
    assert np.isnan(S.clopper_pearson(0, 0)).all()
    # two-sided, 2 · P(X ≤ min): 3 vs 1, 2 · (1 + 4) / 16; 4 vs 0, 2 · 1 / 16; 2 vs 3,
    # 2 · (1 + 5 + 10) / 32 = 1; no wins nor losses, 1
    assert S.sign_test([3, 4, 2, 0], [1, 0, 3, 0]) == pytest.approx([10 / 16, 2 / 16, 1, 1])


def test_divergence_rate_interval_and_saved_lost_seeds(tmp_path):
    """Baseline seeds diverge 1,1,1,1,0 and the clipped group's 0,0,1,0,1: 4/5 against 2/5;
    seeds 0, 1, 3 saved, seed 4 lost, seed 2 a tie; Δ rate −0.4, sign test p = 10/16."""
    for seed, (base, clipped) in enumerate(zip([1, 1, 1, 1, 0], [0, 0, 1, 0, 1], strict=True)):
        for clip, bad in (("null", base), ("0.1", clipped)):
            write_run(tmp_path / f"{clip}_{seed}", [f"clip={clip}", f"seed={seed}"],
                      [2.0, 1.0, math.nan if bad else 1.0])
    runs_table, tidy = S.summarize(S.load_runs(tmp_path)[0], baseline={"clip": "null"})
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
    printed = S.group_table(tidy, ["clip"], {"clip": "null"}).set_index("clip")
    assert printed.loc["null", "diverged"] == "4/5 [0.28, 0.99]"
    assert printed.loc["0.1", "diverged"] == "2/5 [0.05, 0.85]"
    assert printed.loc["0.1", "Δ diverged"] == "-0.4 (3 saved, 1 lost, p=0.62)"
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
    runs, _ = S.load_runs(tmp_path)
    settings = S.Settings(spike_window=1)
    runs_table, tidy = S.summarize(runs, settings, baseline={"clip": "null"})
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
    runs_table, tidy = S.summarize(S.load_runs(tmp_path)[0], S.Settings(spike_window=1),
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


def test_group_values_from_overrides_and_config(tmp_path):
    """Seed and Hydra's keys do not group; a run without a clip override takes its config's
    value, spelled as the other runs wrote it; a config group counts by its name."""
    write_run(tmp_path / "a", ["clip=null", "seed=0", "model=mlp", "hydra/launcher=joblib",
                               "hydra.launcher.n_jobs=2"], ending_at(1.0))
    write_run(tmp_path / "b", ["seed=1"], ending_at(1.0))  # clip null, model mlp: from config
    write_run(tmp_path / "c", ["clip=0.1", "seed=0", "+model.width=32"], ending_at(1.0))
    runs, _ = S.load_runs(tmp_path)
    keys = S.grouping_keys(runs)
    assert keys == ["clip", "model", "model.width"]
    values = S.group_values(runs, keys)
    assert values.to_dict("records") == [
        {"clip": "null", "model": "mlp", "model.width": "16", "seed": "0"},
        {"clip": "null", "model": "mlp", "model.width": "16", "seed": "1"},
        {"clip": "0.1", "model": "mlp", "model.width": "32", "seed": "0"}]


def two_sweeps(root, clip_runs=None, method_runs=None):
    """A clip sweep (clip=null,0.1, preset a) and a clipping-method sweep (clipping=none,agc,
    preset b) of one model, 2 seeds each, in one folder; final losses per seed."""
    finals = {("null", "none"): [2.0, 3.0], ("0.1", "none"): [1.0, 1.0],
              ("null", "agc"): [2.5, 2.0]}
    for seed in range(2):
        for clip in ("null", "0.1"):
            write_run(root / f"a/{clip}_{seed}", [f"clip={clip}", f"seed={seed}",
                                                  "+experiment=a"],
                      ending_at(finals[(clip, "none")][seed]), **(clip_runs or {}))
        for method in ("none", "agc"):
            write_run(root / f"b/{method}_{seed}", [f"clipping={method}", f"seed={seed}",
                                                    "+experiment=b"],
                      ending_at(finals[("null", method)][seed]), **(method_runs or {}))


def test_several_baseline_keys_one_unclipped_group_for_two_sweeps(tmp_path):
    """By default clip=null and clipping=none together: the clip sweep's and the method sweep's
    unclipped runs are one group (a preset's name, the same config, does not split them), and
    every other group is compared with it."""
    two_sweeps(tmp_path)
    runs, _ = S.load_runs(tmp_path)
    keys = S.grouping_keys(runs)
    assert keys == ["clip", "clipping"]  # not `experiment`: presets a and b set the same model
    baseline = S.choose_baseline(None, S.group_values(runs, keys), keys)
    assert baseline == {"clip": "null", "clipping": "none"}
    runs_table, tidy = S.summarize(runs, baseline=baseline)
    final = tidy[tidy["metric"] == "final_loss"].set_index(["clip", "clipping"])
    assert list(final.index) == [("null", "none"), ("null", "agc"), ("0.1", "none")]
    assert final.loc[("null", "none"), "runs"] == 4  # both sweeps' copies, 2 per seed
    assert math.isnan(final.loc[("null", "none"), "diff_mean"])  # the baseline group itself
    assert (final.loc[[("0.1", "none"), ("null", "agc")], "baseline"]
            == "clip=null clipping=none").all()
    assert final.loc[("0.1", "none"), "diff_mean"] == pytest.approx(np.mean([1 - 2, 1 - 3]))
    assert final.loc[("null", "agc"), "diff_mean"] == pytest.approx(np.mean([2.5 - 2, 2 - 3]))
    assert final.loc[("null", "agc"), "wins"] == 1 and final.loc[("null", "agc"), "n_paired"] == 2
    # one baseline key: clipping=agc has clip=null, so it is a baseline group of its own
    _, tidy = S.summarize(runs, baseline={"clip": "null"})
    final = tidy[tidy["metric"] == "final_loss"].set_index(["clip", "clipping"])
    assert math.isnan(final.loc[("null", "agc"), "diff_mean"])
    assert final.loc[("0.1", "none"), "baseline"] == "clip=null clipping=none"


def test_a_preset_that_changes_the_config_stays_a_key(tmp_path):
    two_sweeps(tmp_path, method_runs={"config": {"model": {"width": 32}}})
    runs, _ = S.load_runs(tmp_path)
    assert S.grouping_keys(runs) == ["clip", "experiment", "clipping"]


def test_baseline_option_takes_several_pairs(tmp_path, capsys):
    assert S._baseline_arg("clip=null") == {"clip": "null"}
    assert S._baseline_arg("clip=null,clipping=none") == {"clip": "null", "clipping": "none"}
    assert S._baseline_arg("layer.positions=[a,b],clip=null") == {
        "layer.positions": "[a,b]", "clip": "null"}
    # the default: each of clip=null and clipping=none whose key is swept and value present
    values = pd.DataFrame({"clip": ["0.1", "1"], "clipping": ["none", "agc"]})
    assert S.choose_baseline(None, values, ["clip", "clipping"]) == {"clipping": "none"}
    two_sweeps(tmp_path)
    assert S.main([str(tmp_path), "--baseline", "clipping=none,clip=null"]) == 0
    assert "Baseline clipping=none,clip=null: each group" in capsys.readouterr().out
    tidy = read_csv(tmp_path / "summary.csv")
    assert set(tidy.loc[tidy["clip"] == "0.1", "baseline"]) == {"clip=null clipping=none"}
    assert S.main([str(tmp_path), "--baseline", "clip=null,clipping=zclip"]) == 2
    assert capsys.readouterr().err == ("error: --baseline clipping=zclip: no run has "
                                       "clipping=zclip (clipping values: agc, none)\n")
    with pytest.raises(SystemExit):
        S.main([str(tmp_path), "--baseline", "clip=null,clip=0.1"])
    assert "each key once" in capsys.readouterr().err


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
    _, tidy = S.summarize(S.load_runs(tmp_path)[0], baseline={"clip": "null"})
    table = S.group_table(tidy, ["clip"], {"clip": "null"}).set_index("clip")
    assert [c for c in table.columns if c.startswith("val_")] == shown
    assert [c for c in table.columns if c.startswith("Δ val_")] == [f"Δ {c}" for c in shown]
    if "val_loss" in shown:  # mean 2 ± t(0.975, 1) · √2 / √2 = 12.7
        assert table.loc["0.1", "val_loss"] == "2±13"
        assert table.loc["0.1", "Δ val_loss"] == "+0±0 0/2"  # two ties


def test_param_clip_fraction(tmp_path):
    """The share of steps whose parameter gradients were clipped, over the steps before the
    divergence: clipped 1, 1, 0, 0 before the NaN at step 5: 0.5; printed when logged."""
    for seed in range(2):
        write_run(tmp_path / f"none_{seed}", ["clipping=none", f"seed={seed}"], [2, 1, 1, 1, 1],
                  columns={"param_clip/clipped": [0] * 5})
        write_run(tmp_path / f"agc_{seed}", ["clipping=agc", f"seed={seed}"],
                  [2, 1, 1, 1, math.nan], columns={"param_clip/clipped": [1, 1, 0, 0, 1]})
    runs_table, tidy = S.summarize(S.load_runs(tmp_path)[0], baseline={"clipping": "none"})
    assert runs_table.set_index("run").loc["agc_0", "param_clip_fraction"] == 0.5
    row = tidy[tidy["metric"] == "param_clip_fraction"].set_index("clipping").loc["agc"]
    assert row["mean"] == 0.5 and row["diff_mean"] == 0.5 and math.isnan(row["win_rate"])
    table = S.group_table(tidy, ["clipping"], {"clipping": "none"}).set_index("clipping")
    assert table.loc["agc", "param_clip_fraction"] == "0.5±0"
    assert "Δ param_clip_fraction" not in table  # no "better" direction
    # runs without the column: NaN, and no column in the printed table
    (tmp_path / "old").mkdir()
    write_run(tmp_path / "old" / "a", ["clip=null"], [2, 1])
    write_run(tmp_path / "old" / "b", ["clip=0.1"], [2, 1])
    _, tidy = S.summarize(S.load_runs(tmp_path / "old")[0], baseline={"clip": "null"})
    assert "param_clip_fraction" not in S.group_table(tidy, ["clip"], {"clip": "null"})


# ---------------------------------------------------------------------------------------------
# Unreadable, failed and unfinished runs


def test_unreadable_runs_are_skipped_with_a_reason(tmp_path):
    write_run(tmp_path / "0", ["clip=null", "seed=0"], ending_at(1.0))
    truncated = write_run(tmp_path / "1", ["clip=null", "seed=1"], ending_at(1.0))
    text = (truncated / "metrics.csv").read_text()
    (truncated / "metrics.csv").write_text(text[: text.rindex(",")])  # cut inside the last row
    write_run(tmp_path / "2", ["clip=null", "seed=2"], ending_at(1.0))
    (tmp_path / "2" / "summary.json").write_text("{not json")
    no_hydra = write_run(tmp_path / "3", ["clip=null", "seed=3"], ending_at(1.0))
    for f in (no_hydra / ".hydra").iterdir():
        f.unlink()
    (no_hydra / ".hydra").rmdir()
    empty = write_run(tmp_path / "4", ["clip=null", "seed=4"], ending_at(1.0))
    (empty / "metrics.csv").write_text("")
    runs, skipped = S.load_runs(tmp_path)
    assert [r.name for r in runs] == ["0"]
    reasons = dict(skipped)
    assert list(reasons) == ["1", "2", "3", "4"]
    assert "truncated" in reasons["1"] and "not JSON" in reasons["2"]
    assert ".hydra" in reasons["3"] and "empty" in reasons["4"]


def test_failed_run_is_counted_and_running_run_is_incomplete(tmp_path):
    write_run(tmp_path / "0", ["clip=0.1", "seed=0"], ending_at(1.0))
    write_run(tmp_path / "1", ["clip=0.1", "seed=1"], [4.0, 3.0], status="failed",
              summary={"error": "ValueError: boom"})
    killed = write_run(tmp_path / "2", ["clip=0.1", "seed=2"], [4.0, 3.0, 2.0, 1.0],
                       status="running")
    with open(killed / "metrics.csv", "a") as f:
        f.write("5,0.9,1.0")  # killed while writing a row: the row is dropped, the rest used
    write_run(tmp_path / "3", ["clip=0.1", "seed=3"], [2.0, 1.0, 5000.0], status="diverged",
              summary={"diverged_step": 3})
    runs, skipped = S.load_runs(tmp_path)
    assert skipped == [("1", "failed: ValueError: boom")]
    assert [r.status for r in runs] == ["completed", "failed", "running", "diverged"]
    runs_table, tidy = S.summarize(runs)
    row = tidy[tidy["metric"] == "final_loss"].iloc[0]
    assert (row["runs"], row["completed"], row["failed"], row["incomplete"],
            row["diverged"]) == (4, 1, 1, 1, 1)
    assert row["divergence_rate"] == pytest.approx(1 / 3)  # of the 3 runs with measurements
    assert row["n"] == 3  # the failed run has no final loss
    incomplete = runs_table.set_index("run").loc["2"]
    assert incomplete["final_loss"] == 1.0 and incomplete["mean_loss"] == 2.5  # steps 1-4


def test_event_files_are_read_when_there_is_no_metrics_csv(tmp_path):
    from gradexp._tf import tf

    run = write_run(tmp_path / "r", ["clip=0.1"], LOSSES, norms=NORMS, val=VAL)
    (run / "metrics.csv").unlink()
    writer = tf.summary.create_file_writer(str(run))
    with writer.as_default():
        for step, (loss, norm) in enumerate(zip(LOSSES, NORMS, strict=True), start=1):
            tf.summary.scalar("loss/train", loss, step=step)
            tf.summary.scalar("grad_norm/global", norm, step=step)
            tf.summary.scalar("clip_fraction/dense_1", 0.25, step=step)
            if step in VAL:
                tf.summary.scalar("loss/val", VAL[step][0], step=step)
                tf.summary.scalar("accuracy/val", VAL[step][1], step=step)
        tf.summary.histogram("gradients/w", [1.0, 2.0], step=1)  # not a per-step scalar
        tf.summary.scalar("final/loss", 0.6, step=10)
    writer.close()
    (loaded,), skipped = S.load_runs(run)
    assert skipped == [] and list(loaded.metrics["step"]) == list(range(1, 11))
    assert set(loaded.metrics.columns) == {"step", "loss/train", "grad_norm/global",
                                           "clip_fraction/dense_1", "loss/val", "accuracy/val"}
    m = S.run_metrics(loaded.metrics, S.Settings(spike_window=3))
    assert m["loss_spike_rate"] == 20 and m["grad_norm_cv"] == pytest.approx(math.sqrt(3.2) / 5)
    assert m["clip_fraction"] == 0.25 and m["val_accuracy"] == 0.75


# ---------------------------------------------------------------------------------------------
# The command line


def read_csv(path):
    """summary.csv / runs.csv as a user should read them: `null` is a value, not a blank."""
    return pd.read_csv(path, dtype={"clip": str, "seed": str, "run": str},
                       keep_default_na=False, na_values=[""])


def summarize_cli(*args, cwd):
    return gradexp("gradexp.summarize", *map(str, args), cwd=cwd, timeout=120)


def test_cli_end_to_end(tmp_path):
    sweep = tmp_path / "sweep"
    for seed in range(2):
        for clip in ("null", "0.1", "1"):
            write_run(sweep / f"{clip}_{seed}", [f"clip={clip}", f"seed={seed}"],
                      [4.0, 3.0 + seed, 2.0, 1.5 if clip == "null" else 1.0])
    (sweep / "broken").mkdir()
    (sweep / "broken" / "metrics.csv").write_text("step,loss/train\n1,2\n")
    result = summarize_cli(sweep, "--plots", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[0] == "skipped broken: no .hydra/ (not a Hydra run directory)"
    rows = [line.split()[0] for line in out if line.split() and line.split()[0] in
            ("null", "0.1", "1")]
    assert rows == ["null", "0.1", "1"]  # one row per group, the baseline first
    assert "wrote" in out[-1]
    for name in ("summary.csv", "summary.md", "runs.csv", "loss_curves.png", "grad_norms.png",
                 "final_loss_vs_clip.png"):
        assert (sweep / name).stat().st_size > 0, name
    tidy = read_csv(sweep / "summary.csv")
    assert len(tidy) == 3 * len(S.METRICS)
    assert "## final_loss (lower is better)" in (sweep / "summary.md").read_text()


def test_plots_name_every_panel_and_use_a_log_axis_for_far_apart_losses(tmp_path, monkeypatch):
    """Groups clipping at different positions each appear in their own panel's legend; final
    losses decades apart (diverged runs) are drawn on a log axis whose bottom is above 0."""
    sweep = tmp_path / "sweep"
    for seed in range(2):
        write_run(sweep / f"null_{seed}", ["clip=null", f"seed={seed}"], ending_at(1000.0 + seed))
        write_run(sweep / f"a_{seed}", ["clip=0.1", f"seed={seed}"], ending_at(0.5 - seed / 10))
        write_run(sweep / f"b_{seed}", ["clip=1", f"seed={seed}"], ending_at(0.2),
                  fractions={"dense_2": [0.5] * 10})
    from gradexp import plots

    figures, save = {}, plots._save

    def record(plt, fig, path):
        figures[path.name] = fig.axes
        return save(plt, fig, path)

    monkeypatch.setattr(plots, "_save", record)
    assert S.main([str(sweep), "--plots"]) == 0
    legends = [[t.get_text() for t in ax.get_legend().get_texts()]
               for ax in figures["grad_norms.png"]]
    assert legends == [["clip=null", "clip=0.1"], ["clip=1"]]  # dense_1, dense_2
    (ax,) = figures["final_loss_vs_clip.png"]
    assert ax.get_yscale() == "log" and 0 < ax.get_ylim()[0] < 0.2


def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys):
    result = summarize_cli("/nonexistent", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "error: /nonexistent: no such directory\n"
    (tmp_path / "empty").mkdir()
    assert S.main([str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'empty'}: no readable runs\n"
    write_run(tmp_path / "one" / "a", ["clip=0.1", "layer.scale=1"], ending_at(1.0))
    write_run(tmp_path / "one" / "b", ["clip=0.1", "layer.scale=3"], ending_at(1.0))
    assert S.main([str(tmp_path / "one")]) == 0  # the default baseline may be absent: a note
    assert "No baseline (pass --baseline KEY=VALUE): no comparisons." in capsys.readouterr().out
    assert S.main([str(tmp_path / "one"), "--baseline", "layer.scale=5"]) == 2
    assert capsys.readouterr().err == ("error: --baseline layer.scale=5: no run has "
                                       "layer.scale=5 (layer.scale values: 1, 3)\n")
    assert S.main([str(tmp_path / "one"), "--baseline", "clip=none"]) == 2
    assert capsys.readouterr().err == ("error: --baseline clip=none: clip is not a swept key "
                                       "(keys: layer.scale)\n")


def test_import_does_not_load_tensorflow():
    code = "import sys, gradexp.summarize; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------------
# The bad-input catalogue, summary side


def test_bad_inputs_are_skipped_with_a_reason_never_a_traceback(tmp_path):
    """The summary's half of the bad-input catalogue: each case is answered by a
    `skipped <run>: <reason>` line (or summarized, where the data allow it), exit 0."""
    sweep = tmp_path / "sweep"
    for seed in range(2):
        write_run(sweep / f"good_{seed}", ["clip=null", f"seed={seed}"], ending_at(1.0))
    # a run whose only record is a corrupt event file
    corrupt = write_run(sweep / "corrupt_events", ["clip=0.1", "seed=0"], ending_at(1.0))
    (corrupt / "metrics.csv").unlink()
    (corrupt / "events.out.tfevents.1.host.v2").write_bytes(b"\x00garbage, not a record" * 9)
    # NaNs in a metrics table: a diverged run, summarized as one
    write_run(sweep / "nan_loss", ["clip=0.1", "seed=1"], [4.0, 3.0, float("nan"), 2.0])
    # a table cut off in the middle of a line (and its summary says completed)
    cut = write_run(sweep / "truncated", ["clip=1", "seed=0"], ending_at(1.0))
    (cut / "metrics.csv").write_text((cut / "metrics.csv").read_text()[:-7])
    result = summarize_cli(sweep, cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "Traceback" not in result.stdout
    skipped = [line for line in result.stdout.splitlines() if line.startswith("skipped ")]
    assert any(line.startswith("skipped corrupt_events: ") for line in skipped), skipped
    assert any(line.startswith("skipped truncated: ") for line in skipped), skipped
    runs_table = pd.read_csv(sweep / "runs.csv", keep_default_na=False, na_values=[""])
    nan_run = runs_table[runs_table["run"] == "nan_loss"].iloc[0]
    assert nan_run["diverged"] == 1 and nan_run["diverged_step"] == 3

    single = sweep / "good_0"  # not a sweep: one run directory is summarized as one group
    result = summarize_cli(single, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (single / "summary.csv").exists()
