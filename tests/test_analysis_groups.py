"""gradexp.analysis.groups: which keys group runs, each run's values (from its overrides or its
config), presets that only name runs, and several baseline keys."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fake_runs import ending_at, two_sweeps, write_run

from gradexp.analysis.compare import summarize
from gradexp.analysis.groups import group_values, grouping_keys
from gradexp.analysis.runs import load_runs
from gradexp.summarize import choose_baseline


def test_group_values_from_overrides_and_config(tmp_path):
    """Seed and Hydra's keys do not group; a run without a clip override takes its config's
    value, spelled as the other runs wrote it; a config group counts by its name."""
    write_run(tmp_path / "a", ["clip=null", "seed=0", "model=mlp", "hydra/launcher=joblib",
                               "hydra.launcher.n_jobs=2"], ending_at(1.0))
    write_run(tmp_path / "b", ["seed=1"], ending_at(1.0))  # clip null, model mlp: from config
    write_run(tmp_path / "c", ["clip=0.1", "seed=0", "+model.width=32"], ending_at(1.0))
    runs, _ = load_runs(tmp_path)
    keys = grouping_keys(runs)
    assert keys == ["clip", "model", "model.width"]
    values = group_values(runs, keys)
    assert values.to_dict("records") == [
        {"clip": "null", "model": "mlp", "model.width": "16", "seed": "0"},
        {"clip": "null", "model": "mlp", "model.width": "16", "seed": "1"},
        {"clip": "0.1", "model": "mlp", "model.width": "32", "seed": "0"}]


@pytest.mark.slow
def test_several_baseline_keys_one_unclipped_group_for_two_sweeps(tmp_path):
    """By default clip=null and clipping=none together: the clip sweep's and the method sweep's
    unclipped runs are one group (a preset's name, the same config, does not split them), and
    every other group is compared with it."""
    two_sweeps(tmp_path)
    runs, _ = load_runs(tmp_path)
    keys = grouping_keys(runs)
    assert keys == ["clip", "clipping"]  # not `experiment`: presets a and b set the same model
    baseline = choose_baseline(None, group_values(runs, keys), keys)
    assert baseline == {"clip": "null", "clipping": "none"}
    runs_table, tidy = summarize(runs, baseline=baseline)
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
    _, tidy = summarize(runs, baseline={"clip": "null"})
    final = tidy[tidy["metric"] == "final_loss"].set_index(["clip", "clipping"])
    assert math.isnan(final.loc[("null", "agc"), "diff_mean"])
    assert final.loc[("0.1", "none"), "baseline"] == "clip=null clipping=none"


def test_a_preset_that_changes_the_config_stays_a_key(tmp_path):
    two_sweeps(tmp_path, method_runs={"config": {"model": {"width": 32}}})
    runs, _ = load_runs(tmp_path)
    assert grouping_keys(runs) == ["clip", "experiment", "clipping"]


def test_keys_named_like_pandas_own_columns(tmp_path):
    """A sweep of keys `index` and `level_0` (the names pandas gives an index it turns into a
    column): grouped and compared like any other. Final losses 1 + seed + i for the i-th group:
    index=2 is 1 above index=1 at both seeds, at each level_0."""
    settings = [("1", "x"), ("2", "x"), ("1", "y"), ("2", "y")]
    for i, (index, level) in enumerate(settings):
        for seed in range(2):
            write_run(tmp_path / f"{i}_{seed}", [f"index={index}", f"level_0={level}",
                                                 f"seed={seed}"], ending_at(1.0 + seed + i))
    _, tidy = summarize(load_runs(tmp_path)[0], baseline={"index": "1"})
    final = tidy[tidy["metric"] == "final_loss"].set_index("group")
    assert list(final.index) == ["index=1 level_0=x", "index=1 level_0=y",
                                 "index=2 level_0=x", "index=2 level_0=y"]
    assert list(final["baseline"].iloc[2:]) == ["index=1 level_0=x", "index=1 level_0=y"]
    assert list(final["diff_mean"].iloc[2:]) == [1.0, 1.0]
    assert list(final["losses"].iloc[2:]) == [2, 2]
