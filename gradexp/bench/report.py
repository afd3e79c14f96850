"""The bench's figures as a Markdown page: `python -m gradexp.bench --markdown FILE.json`.

FILE.json is the JSON object `python -m gradexp.bench` prints as its last line (figure name ->
value, a ratio's spread as `<name>_min` and `<name>_max`), or `{"about": {...}, "figures":
{...}}`: the same figures with where, when and on what they were measured, which the page
states first; or a list of such runs, a section each. Each ratio the bench names below is a row
with its target, if it has one, and whether it is met: its median meets it and its spread lies
within ±10% of the median (the targets' terms); every other figure is listed with its value.
No TensorFlow here.
"""

from __future__ import annotations

import json
from pathlib import Path

from gradexp.bench.rounds import SPREAD, steady

# name: (target, what is compared); a target is (">=" or "<=", bound) or None
RATIOS: dict[str, tuple[tuple[str, float] | None, str]] = {
    "vs_keras_fit": ((">=", 1.5), "gradexp's steps/s ÷ Keras `model.fit`'s: the default MLP "
                     "with clip layers, the same data, batch and optimizer"),
    "vs_keras_fit_cnn": ((">=", 1.0), "the same for the CNN on digits"),
    "vs_keras_fit_rnn": ((">=", 1.0), "the same for the RNN on the adding problem"),
    "vs_keras_fit_transformer": ((">=", 1.0), "the same for the transformer on digits"),
    "vs_bare_loop": ((">=", 0.9), "÷ a bare `tf.function` loop, one call per step, nothing "
                     "logged"),
    "vs_bare_loop_wide": ((">=", 0.95), "the same on a compute-bound MLP (width 1024, batch "
                          "512)"),
    "flop_fraction": (None, "that MLP's FLOP rate ÷ a 2048² `tf.matmul`'s"),
    "logging_overhead": (("<=", 1.05), "time per step with the default logging ÷ the same "
                         "compiled calls, nothing written"),
    "logging_overhead_no_telemetry": (None, "the same with `trainer.layer_norms=false` in both"),
    "layer_overhead": (None, "clip layers at `clip=null` ÷ no clip layers"),
    "telemetry_overhead": (None, "`trainer.layer_norms=true` ÷ false"),
    "sweep_speedup": ((">=", 3.0), "`-m clip=null,0.1 seed=0,1,2,3,4`: the basic launcher ÷ "
                      "`hydra/launcher=gradexp`, launch to exit"),
    "sweep_speedup_stateful": ((">=", 2.5), "the same sweep with `clipping=zclip`"),
    "sweep_speedup_rnn": (None, "the same on the exploding-RNN preset (clip layer in the "
                          "recurrence)"),
    "summarize_vs_tbparse": ((">=", 20.0), "tbparse's time to load a 100-run sweep ÷ "
                             "`gradexp.summarize`'s to summarize it"),
    "config_error_s": (("<=", 2.0), "seconds from launching `python -m gradexp.train clip=-1` "
                       "to its one-line error"),
    "checkpoint_cost": (None, "a checkpoint every 100 steps ÷ none"),
    "determinism_cost": (None, "`deterministic=true` ÷ false"),
}


METHOD = """\
What gradexp costs over the model's own arithmetic, as ratios (`python -m gradexp.bench`; the
code: gradexp/bench/: run.py, sweeps.py, rounds.py). Every comparison runs in
one process, side by side: the variants take turns in rounds, each round in the other order
than the last, and each ratio is computed round by round and given as its median with the
smallest and largest round's. gradexp's steps/s are a run's own figure (`steps_per_s` in
summary.json): from the end of the first compiled call to the end of the loop, logging,
evaluation and checkpoints included. This page is generated from the bench's JSON
(`python -m gradexp.bench --markdown FILE.json`); ratios move by about ±10% between full runs
on a shared machine."""


def number(value: float) -> str:
    """Two decimals for a ratio (4.00, 0.98), three significant digits otherwise."""
    if 0.1 <= abs(value) < 10:
        return f"{value:.2f}"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def meets(figures: dict[str, float], name: str, target: tuple[str, float] | None) -> str:
    """yes: the median meets the target and the spread is steady (rounds.steady); **no**: the
    median misses; otherwise the median alone meets it."""
    if target is None:
        return ""
    op, bound = target
    value = figures[name]
    if not (value >= bound if op == ">=" else value <= bound):
        return "**no**"
    if f"{name}_min" in figures and not steady(figures, name):
        return f"median only: spread wider than ±{SPREAD:.0%}"
    return "yes"


def markdown(data: dict | list[dict]) -> str:
    """The page: for each run (one, or a list), what was measured (`about`), the ratios against
    their targets, the rest."""
    runs = data if isinstance(data, list) else [data]
    lines = ["# Performance", "", METHOD, ""]
    for k, run in enumerate(runs, 1):
        if len(runs) > 1:
            lines += [f"## Full run {k} of {len(runs)}", ""]
        lines += run_lines(run) + [""]
    return "\n".join(lines[:-1]) + "\n"


def run_lines(data: dict) -> list[str]:
    """One run's part of the page."""
    figures = data.get("figures", data)
    about = data.get("about", {})
    lines = []
    if about:
        lines += [f"- **{key}**: {value}" for key, value in about.items()] + [""]
    lines += ["| figure | measured: median (min–max) | target | met | what is compared |",
              "| --- | --- | --- | --- | --- |"]
    shown = set()
    for name, (target, what) in RATIOS.items():
        if name not in figures:
            continue
        shown |= {name, f"{name}_min", f"{name}_max"}
        spread = (f" ({number(figures[name + '_min'])}–{number(figures[name + '_max'])})"
                  if f"{name}_min" in figures else "")
        bound = f"{target[0].replace('>=', '≥').replace('<=', '≤')} {target[1]:g}" if target else ""
        lines.append(f"| `{name}` | {number(figures[name])}{spread} | {bound} | "
                     f"{meets(figures, name, target)} | {what} |")
    rest = [name for name in figures if name not in shown]
    if rest:
        lines += ["", "The other figures of the run (steps/s, seconds, GFLOP/s: the measurements "
                  "behind the ratios):", "", "| figure | value |", "| --- | --- |"]
        lines += [f"| `{name}` | {number(figures[name])} |" for name in rest]
    return lines


def render(path: str | Path) -> str:
    return markdown(json.loads(Path(path).read_text()))
