"""`python -m gradexp.bench --quick` as a user runs it, at a toy scale (`--smoke`): every
measurement of --quick runs and its last line is one JSON object of the figures the performance
page's table names (docs/performance.md). Timings are not checked (they mean nothing at this
scale): only that every figure is there and is a positive finite number."""

from __future__ import annotations

import json
import math

import pytest

from conftest import gradexp

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

RATIOS = {  # the performance page's table (docs/performance.md), each with its spread
    "vs_keras_fit", "vs_bare_loop", "vs_bare_loop_wide", "flop_fraction", "layer_overhead",
    "logging_overhead", "logging_overhead_no_telemetry", "telemetry_overhead",
    "summarize_vs_tbparse", "config_error_s"}
QUICK_FIGURES = {
    *RATIOS, *(f"{name}_{end}" for name in RATIOS for end in ("min", "max")),
    # the raw figures behind them
    *(f"steps_per_s_{v}" for v in ("gradexp", "unlogged", "no_telemetry", "unlogged_no_telemetry",
                                   "no_layers", "bare_loop", "keras_fit", "wide_gradexp",
                                   "wide_bare_loop")),
    "gflop_per_s_wide", "gflop_per_s_matmul", "tbparse_s", "summarize_s",
}


def test_bench_quick_prints_every_figure_as_one_json_line(tmp_path):
    result = gradexp("gradexp.bench", "--quick", "--smoke", cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures) == QUICK_FIGURES
    assert all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0
               for v in figures.values()), figures
    for name in RATIOS:  # one round: its spread is the figure itself
        assert figures[f"{name}_min"] == figures[name] == figures[f"{name}_max"], name
    assert "vs_keras_fit " in result.stdout  # a line per measurement, as it is taken
    assert list(tmp_path.iterdir()) == []  # its runs and sweep live in temporary directories


def test_the_sweep_bench_reads_run_logs_counts_overlap_once_and_takes_the_faster_way(tmp_path):
    """bench_sweeps: a run's stepping interval from the train.log gradexp writes (its own
    formatter), two batches stepping at once counted once, and `sweep_speedup` the faster of
    one and two workers (medians of rounds)."""
    import time

    from gradexp.bench import sweeps as bench_sweeps
    from gradexp.sweeps import grouping
    from gradexp.train import run_logger

    job = grouping.Job(None, tmp_path, [])
    logger = run_logger(job)
    logger.info("training mlp on synthetic (20 steps)")
    first = time.time()
    for line in ("step   10/20  loss 0.5", "step   20/20  loss 0.4"):
        logger.info(line)
        time.sleep(0.05)
    last = time.time() - 0.05
    a, b = bench_sweeps.stepping(tmp_path / "train.log")
    assert first - 0.002 <= a <= b <= last + 0.002 and b - a >= 0.045  # ms in the log's clock
    (tmp_path / "short.log").write_text((tmp_path / "train.log").read_text().splitlines()[1])
    assert bench_sweeps.stepping(tmp_path / "short.log") is None  # one step line: no interval
    assert bench_sweeps.union_length([(5, 6), (0, 2), (1, 3)]) == 4

    walls = {"basic": [40, 44, 42], "one_worker": [14, 15, 13], "two_workers": [16, 15, 17]}
    fractions = {"basic": [0.3] * 3, "one_worker": [0.4, 0.5, 0.45], "two_workers": [0.4] * 3}
    mlp = bench_sweeps.ratios(walls, fractions)
    # round by round: 40/14, 44/15, 42/13; the faster way by median wall time (14 < 16)
    assert mlp["sweep_speedup"] == mlp["sweep_speedup_one_worker"] == 44 / 15
    assert mlp["sweep_speedup_min"] == 40 / 14 and mlp["sweep_speedup_max"] == 42 / 13
    assert mlp["sweep_step_fraction"] == 0.45 and mlp["sweep_workers"] == 1
    assert mlp["sweep_speedup_two_workers"] == 40 / 16  # of 40/16, 44/15, 42/17
    walls["two_workers"] = [12, 11, 12.5]
    rnn = bench_sweeps.ratios(walls, fractions, "_rnn")
    assert rnn["sweep_speedup_rnn"] == 42 / 12.5 and rnn["sweep_workers_rnn"] == 2
    assert rnn["sweep_step_fraction_rnn"] == 0.4 and rnn["sweep_s_one_worker_rnn"] == 14


def test_a_figure_is_steady_when_every_round_lies_within_ten_percent_of_its_median():
    from gradexp.bench import rounds

    figures = rounds.ratio("speedup", [30.0, 33.0, 31.0], [10.0, 10.0, 10.0])
    assert figures == {"speedup": 3.1, "speedup_min": 3.0, "speedup_max": 3.3}
    assert rounds.steady(figures, "speedup")  # 3.0 and 3.3 within 3.1 ± 0.31
    assert not rounds.steady(rounds.ratio("s", [30.0, 36.0, 31.0], [10.0] * 3), "s")  # 3.6
    assert rounds.shown(figures) == "speedup 3.1 (3–3.3)"


def test_the_page_calls_a_target_met_only_when_the_median_meets_it_and_the_spread_is_steady():
    from gradexp.bench import report

    target = (">=", 1.5)  # vs_keras_fit's
    steady = {"vs_keras_fit": 2.0, "vs_keras_fit_min": 1.9, "vs_keras_fit_max": 2.2}
    wide = {"vs_keras_fit": 2.0, "vs_keras_fit_min": 1.7, "vs_keras_fit_max": 2.2}  # 2 × 0.9 > 1.7
    missed = {"vs_keras_fit": 1.4, "vs_keras_fit_min": 1.39, "vs_keras_fit_max": 1.41}
    assert report.meets(steady, "vs_keras_fit", target) == "yes"
    assert report.meets(wide, "vs_keras_fit", target) == "median only: spread wider than ±10%"
    assert report.meets(missed, "vs_keras_fit", target) == "**no**"
    assert report.meets({"config_error_s": 0.5}, "config_error_s", ("<=", 2)) == "yes"  # no spread
    assert report.meets({"config_error_s": 2.5}, "config_error_s", ("<=", 2)) == "**no**"
    assert report.meets(steady, "vs_keras_fit", None) == ""
    row = next(line for line in report.run_lines(wide) if line.startswith("| `vs_keras_fit`"))
    assert row.startswith("| `vs_keras_fit` | 2.00 (1.70–2.20) | ≥ 1.5 | median only: spread ")
