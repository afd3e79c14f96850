"""`python -m gradexp.bench --quick` as a user runs it, at a toy scale (`--smoke`): every
measurement of --quick runs and its last line is one JSON object of the figures the README's
performance table names. Timings are not checked (they mean nothing at this scale): only that
every figure is there and is a positive finite number."""

from __future__ import annotations

import json
import math

from conftest import gradexp

QUICK_FIGURES = {
    # ratios (the README's table)
    "vs_keras_fit", "vs_bare_loop", "vs_bare_loop_wide", "flop_fraction", "layer_overhead",
    "logging_overhead", "logging_overhead_no_telemetry", "telemetry_overhead",
    "summarize_vs_tbparse", "config_error_s",
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
    assert list(tmp_path.iterdir()) == []  # its runs and sweep live in temporary directories
