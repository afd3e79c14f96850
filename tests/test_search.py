"""A search with Optuna (`-m hydra/sweeper=optuna`): a real multirun through gradexp's search
sweeper and Hydra's basic launcher, then `python -m gradexp.summarize` on its directory."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from conftest import gradexp, logged_lines
from gradexp.runs.measures import search_objective, trial_objective

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

# Tiny runs (as tests/test_sweeps.py) at a learning rate where an unclipped run, or one clipped
# at 100, diverges within 10 steps and one clipped at 0.05 or below does not (seeds 0 and 1).
TINY = ["trainer.jit_compile=false", "trainer.steps=30", "trainer.log_every=10",
        "trainer.eval_every=30", "trainer.histogram_every=0", "model.width=8",
        "optimizer.learning_rate=0.5"]
SEARCH = ["hydra/sweeper=optuna", "clip=tag(log, interval(0.001, 0.05))", "seed=0,1",
          "hydra.sweeper.n_trials=6", "hydra.sweeper.enqueue=[{clip: 100}]"]


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("search")
    result = gradexp("gradexp.train", "-m", *SEARCH, *TINY, cwd=cwd, timeout=600)
    (sweep_dir,) = (cwd / "outputs" / "multirun").glob("*/*")
    return sweep_dir, result


def summaries(sweep_dir: Path) -> dict[str, dict]:
    return {d.name: json.loads((d / "summary.json").read_text())
            for d in sweep_dir.iterdir() if (d / ".hydra").is_dir()}


def test_a_search_runs_each_trial_over_the_seeds_and_ranks_a_diverged_trial_last(search):
    sweep_dir, result = search
    assert result.returncode == 0, result.stderr
    runs = summaries(sweep_dir)
    assert sorted(runs, key=int) == [str(i) for i in range(12)]  # 6 trials x 2 seeds
    history = pd.read_csv(sweep_dir / "search.csv", dtype={"jobs": str, "values": str})
    assert list(history["trial"]) == list(range(6))
    assert (history["seeds"] == 2).all() and (history["state"] == "complete").all()

    enqueued = history.iloc[0]  # clip=100: tried first, diverges with both seeds
    assert enqueued["clip"] == 100 and enqueued["value"] == math.inf
    assert enqueued["diverged"] == 2
    for job in enqueued["jobs"].split():
        run = runs[job]
        assert run["status"] == "diverged" and run["config"]["clip"] == 100
        # stopped once it diverged: at the end of its first call of 10 steps, not at 30
        assert run["diverged_step"] <= run["steps"] == 10 < run["config"]["trainer"]["steps"]

    searched = history.iloc[1:]
    assert ((searched["clip"] >= 0.001) & (searched["clip"] <= 0.05)).all()
    assert searched["clip"].nunique() == 5 and (searched["diverged"] == 0).all()
    for _, trial in searched.iterrows():  # a trial's value: its seeds' mean final loss
        jobs = trial["jobs"].split()
        assert sorted(runs[j]["config"]["seed"] for j in jobs) == [0, 1]
        assert all(runs[j]["config"]["clip"] == pytest.approx(trial["clip"]) for j in jobs)
        assert trial["value"] == pytest.approx(sum(runs[j]["final_loss"] for j in jobs) / 2)
    best = searched.loc[searched["value"].idxmin()]
    assert f"search: best clip={best['clip']:.4g} (trial {best['trial']})" in result.stderr + \
        result.stdout
    assert "sweep: 12 runs (10 completed, 2 diverged)" in result.stdout
    assert list(sweep_dir.glob("events.out.tfevents.*"))  # the HParams view's experiment


def test_summarize_reads_the_search_and_names_the_best_value_with_its_seeds_spread(search):
    sweep_dir, _ = search
    result = gradexp("gradexp.summarize", str(sweep_dir), cwd=sweep_dir)
    assert result.returncode == 0, result.stderr
    history = pd.read_csv(sweep_dir / "search.csv", dtype={"jobs": str})
    best = history.loc[history["value"].idxmin()]
    losses = [json.loads((sweep_dir / j / "summary.json").read_text())["final_loss"]
              for j in best["jobs"].split()]
    spread = pd.Series(losses)
    line = (f"best: clip={best['clip']:.4g} (trial {best['trial']}): final_loss "
            f"{spread.mean():.4g}, sd {spread.std():.4g} over 2 seeds "
            f"(from {spread.min():.4g} to {spread.max():.4g})")
    assert line in result.stdout
    table = result.stdout.split("search: 6 trials")[1].splitlines()
    rows = {int(r.split()[1]): r.split() for r in table[3:9]}  # trial -> its row's cells
    assert sorted(rows) == list(range(6))  # the history, every trial
    assert rows[0][0] == "6" and rows[0][3] == "inf"  # the diverged trial: ranked last
    assert rows[int(best["trial"])][0] == "1"
    # like any sweep: a group per clip value, the diverged one counted as such
    tidy = pd.read_csv(sweep_dir / "summary.csv", keep_default_na=False, na_values=[""])
    assert tidy["clip"].nunique() == 6
    assert "## Search" in (sweep_dir / "summary.md").read_text()


@pytest.mark.parametrize("space, message", [
    ("clip=tag(log, interval(0, 1))",
     "error: clip=tag(log, interval(0, 1)): a log scale needs a positive low bound (got 0)"),
    ("clipp=interval(0.1, 1)", "error: clipp: no such key; allowed: model, dataset"),
    ("clip=interval(-1, 1)", "error: clip=-1.0: must be a positive number or null"),
])
def test_a_bad_search_space_is_one_line_and_exit_2_before_any_run(tmp_path, monkeypatch, capsys,
                                                                  space, message):
    from conftest import exit_of

    monkeypatch.chdir(tmp_path)
    assert exit_of(monkeypatch, "-m", "hydra/sweeper=optuna", space, "seed=0,1") == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.splitlines()) == 1
    assert not (tmp_path / "outputs").exists()


def test_the_objective_ranks_a_diverged_run_after_every_finite_one():
    completed = {"status": "completed", "diverged": False, "final_loss": 0.5, "val_loss": 0.7}
    diverged = {"status": "diverged", "diverged": True, "final_loss": 0.1}
    assert search_objective(completed, "final_loss") == 0.5
    assert search_objective(completed, "val_loss") == 0.7
    assert search_objective(diverged, "final_loss") == math.inf  # not its pre-divergence loss
    assert search_objective({"status": "failed"}, "final_loss") is None
    assert trial_objective([0.5, 0.7]) == pytest.approx(0.6)
    assert trial_objective([0.5, math.inf]) == math.inf
    assert trial_objective([0.5, None]) is None


def test_a_search_through_the_entry_point_in_this_process_tells_optuna_each_trial(
        tmp_path, monkeypatch):
    """The search sweeper run here (mutation testing sees only this process): the enqueued
    clip=100 is tried first, without Optuna's warning that it lies outside the range, and
    diverges (+inf, ranked last); the sampled trial's value is its run's final loss; search.csv
    has a row a trial, each naming its job; the space and the best trial are logged; the sweep
    directory is made with its parents."""
    import warnings

    from conftest import hparams_experiment, in_this_process

    monkeypatch.chdir(tmp_path)
    lines = logged_lines(monkeypatch, "gradexp.sweeps.search.sweeper")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        in_this_process(monkeypatch, "-m", "hydra/sweeper=optuna",
                        "clip=tag(log, interval(0.001, 0.05))", "seed=0",
                        "hydra.sweeper.n_trials=2", "hydra.sweeper.enqueue=[{clip: 100}]", *TINY,
                        "hydra.sweep.dir=deep/er/search")
    assert not [w for w in caught if "out of range" in str(w.message)]
    sweep_dir = tmp_path / "deep" / "er" / "search"
    rows = pd.read_csv(sweep_dir / "search.csv")
    assert list(rows["trial"]) == [0, 1] and list(rows["state"]) == ["complete"] * 2
    assert rows["clip"][0] == 100 and 0.001 <= rows["clip"][1] <= 0.05
    assert rows["value"][0] == math.inf and list(rows["diverged"]) == [1, 0]
    assert list(rows["jobs"]) == [0, 1]  # each trial's one job, by its directory
    values = pd.read_csv(sweep_dir / "search.csv", dtype={"values": str})["values"]
    assert list(values) == ["inf", repr(float(rows["value"][1]))]  # each seed's, in full
    found = summaries(sweep_dir)
    assert rows["value"][1] == found["1"]["final_loss"] and found["0"]["status"] == "diverged"
    assert hparams_experiment(sweep_dir).domains["clip"] == sorted(
        ["100.0", str(float(rows["clip"][1]))])
    assert lines[0] == ("search: 2 trials of clip in [0.001, 0.05] (log scale), each over one "
                         "seed; objective final_loss (lower is better; a diverged run ranks last)")
    assert lines[1:3] == [
        "search trial 0 (clip=100): final_loss inf (1 of 1 runs diverged)",
        f"search trial 1 (clip={rows['clip'][1]:.4g}): final_loss {rows['value'][1]:.6g}"]
    assert lines[-1] == (f"search: best clip={rows['clip'][1]:.4g} (trial 1): final_loss "
                          f"{rows['value'][1]:.6g}; history in search.csv".replace(
                              "search.csv", str(Path("deep/er/search/search.csv"))))


def test_a_trial_whose_runs_crash_is_failed_and_the_search_goes_on(tmp_path, monkeypatch):
    """64 examples of which 51 train, batches of 64: every run fails when it starts training
    (a check the corners cannot make: it needs the data). Each trial is told to Optuna as
    failed, logged and recorded so (its two seeds' values empty, space-separated); the search
    goes on to its last trial; with no trial valued, the best line says so; the sweep exits 1
    (runs did not finish). Told as failed in so many words: Optuna warns when it must infer the
    state from a value of None."""
    import warnings

    from conftest import in_this_process

    monkeypatch.chdir(tmp_path)
    lines = logged_lines(monkeypatch, "gradexp.sweeps.search.sweeper")
    with pytest.raises(SystemExit) as exit, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        in_this_process(monkeypatch, "-m", *TINY, "hydra/sweeper=optuna", "seed=0,1",
                        "clip=interval(0.01, 0.05)", "dataset=teacher",
                        "dataset.num_examples=64", "hydra.sweeper.n_trials=2",
                        "hydra.sweep.dir=search")
    assert exit.value.code == 1
    assert not [w for w in caught if "could not be cast to float" in str(w.message)]
    rows = pd.read_csv(tmp_path / "search" / "search.csv", keep_default_na=False, dtype=str)
    assert list(rows["state"]) == ["fail", "fail"] and list(rows["value"]) == ["", ""]
    assert list(rows["seeds"]) == ["2", "2"] and list(rows["values"]) == [" ", " "]
    assert list(rows["jobs"]) == ["0 1", "2 3"]  # each trial's two jobs, by their directories
    assert [line.split(": ", 1)[1] for line in lines[1:3]] == ["final_loss failed"] * 2
    assert lines[-1] == f"search: no trial has a value (see {Path('search/search.csv')})"


def test_the_sampler_seed_decides_the_points_and_n_jobs_the_batches(tmp_path, monkeypatch):
    """Two searches with sampler_seed 3 ask for the same first point, one with 4 for another;
    5 trials in batches of n_jobs=2 (2, 2, 1) are 5 jobs, numbered 0-4 across the batches."""
    from conftest import in_this_process

    monkeypatch.chdir(tmp_path)

    def searched(name: str, *settings: str) -> pd.DataFrame:
        in_this_process(monkeypatch, "-m", "hydra/sweeper=optuna", "seed=0",
                        "clip=tag(log, interval(0.001, 0.05))", *settings, *TINY,
                        "trainer.steps=10", "trainer.eval_every=10", f"hydra.sweep.dir={name}")
        return pd.read_csv(tmp_path / name / "search.csv")

    batched = searched("a", "hydra.sweeper.sampler_seed=3", "hydra.sweeper.n_trials=5",
                     "hydra.sweeper.n_jobs=2")
    assert list(batched["trial"]) == [0, 1, 2, 3, 4] and list(batched["jobs"]) == [0, 1, 2, 3, 4]
    assert sorted(summaries(tmp_path / "a")) == ["0", "1", "2", "3", "4"]
    first = searched("b", "hydra.sweeper.sampler_seed=3", "hydra.sweeper.n_trials=1")["clip"][0]
    other = searched("c", "hydra.sweeper.sampler_seed=4", "hydra.sweeper.n_trials=1")["clip"][0]
    assert batched["clip"][0] == first != other


def test_a_sampled_point_whose_config_fails_ends_the_search_in_one_line(tmp_path, monkeypatch):
    """The corners of the space are checked before the search, but a check need not hold
    between them: widths 8-16 in steps of 2 with 4 heads pass at 8 and 16, not at 10 or 14. The
    first trial at such a width ends the search: one line naming the trial, exit 2; the trials
    before it stay in search.csv."""
    import io
    import re
    import sys

    from conftest import in_this_process

    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with pytest.raises(SystemExit) as exit:
        in_this_process(monkeypatch, "-m", *TINY, "hydra/sweeper=optuna", "seed=0",
                        "model=transformer", "dataset=adding", "dataset.num_examples=128",
                        "model.heads=4", "model.width=range(8, 17, 2)", "model.mlp_width=8",
                        "model.blocks=1", "hydra.sweeper.n_trials=10", "trainer.steps=4",
                        "trainer.eval_every=4", "hydra.sweep.dir=search")
    assert exit.value.code == 2
    line = err.getvalue().strip()
    assert re.fullmatch(r"error: search trial (\d+) \(model\.width=(10|14)\): model\.width=\2: "
                        r"must be a multiple of heads \(4\)", line), line
    failed = int(re.search(r"trial (\d+)", line).group(1))
    assert list(pd.read_csv(tmp_path / "search" / "search.csv")["trial"]) == list(range(failed))


def test_a_search_whose_every_trial_diverged_says_so_with_its_record():
    """best_line when every finished trial's value is +inf (each ranked last: diverged)."""
    import optuna

    from gradexp.sweeps.search.sweeper import best_line

    study = optuna.create_study()
    for clip in (1.0, 2.0):
        study.add_trial(optuna.trial.create_trial(
            params={"clip": clip}, value=math.inf,
            distributions={"clip": optuna.distributions.FloatDistribution(0.5, 4.0)}))
    assert best_line(study, None, Path("sweep")) == (
        f"search: every trial diverged (see {Path('sweep/search.csv')})")
