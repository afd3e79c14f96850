"""Summarize a sweep: how much more (or less) stably each setting trained than its baseline.

    python -m gradexp.summarize DIR [--baseline clip=null,clipping=none] [--plots]

Top to bottom: reading run directories (`load_runs`), grouping runs by their overrides
(`grouping_keys`, `group_values`), the per-run metrics (one small function each, its formula in
the docstring; `run_metrics` applies them), each group against its matching baseline group over
paired seeds (`compare`), the printed table and files, `main`. Definitions: README, "Summarizing
a sweep". TensorFlow loads only to read event files (a run without metrics.csv); matplotlib only
with --plots (gradexp.plots).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from gradexp.measures import divergence_step, final_loss

YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # ~10x faster than pure Python
DEFAULT_BASELINE = {"clip": "null", "clipping": "none"}
SEED_KEY, LOSS, GRAD_NORM = "seed", "loss/train", "grad_norm/global"
UNSET = "(unset)"  # a swept key that neither a run's overrides nor its config has
ONE_GROUP = "sweep"  # the key of the single group when no key but the seed was swept

METRICS: dict[str, str | None] = {  # each metric, the better direction (None: no wins)
    "diverged": "lower", "diverged_step": None, "final_loss": "lower", "val_loss": "lower",
    "val_accuracy": "higher", "loss_spike_rate": "lower", "mean_loss": "lower",
    "grad_norm_mean": None, "grad_norm_cv": "lower", "grad_norm_p99_p50": "lower",
    "grad_norm_max": "lower", "clip_fraction": None, "param_clip_fraction": None,
    "steps_to_target": "lower"}
RUN_EXTRAS = ["loss_spikes", "measured_steps"]  # in runs.csv: the rate's numerator, denominator
COUNTS = ("runs", "completed", "diverged", "failed", "incomplete")
# summary.csv, one row per group × metric: the group's keys and label, then these
SUMMARY_COLUMNS = ["metric", "better", "n", "mean", "std", "ci_low", "ci_high",
                   "baseline", "n_paired", "n_diff", "diff_mean", "diff_ci_low", "diff_ci_high",
                   "wins", "ties", "losses", "win_rate", "sign_p", *COUNTS, "divergence_rate",
                   "divergence_ci_low", "divergence_ci_high", "target_loss"]


@dataclass(frozen=True)
class Settings:
    """The knobs of the metrics (the command line's options)."""

    final_fraction: float = 0.1
    spike_factor: float = 2.0
    spike_window: int = 20
    spike_min_rise: float = 0.05
    target_loss: float | None = None  # None: from each group's matching baseline group


DEFAULTS = Settings()


@dataclass
class Run:
    """One readable run directory; `metrics` is None for a failed run (counted, not measured)."""

    name: str  # the directory relative to the summarized folder
    overrides: dict[str, str]
    config: dict[str, Any]
    summary: dict[str, Any]
    status: str  # completed | diverged | running | failed | unknown (no summary.json)
    metrics: pd.DataFrame | None = field(default=None, repr=False)


class Unreadable(Exception):
    """A run directory that cannot be summarized; the message is the reason shown."""


# ---------------------------------------------------------------------------------------------
# Reading runs


RUN_MARKERS = {".hydra", "metrics.csv", "summary.json"}  # a directory with one is a run


def load_runs(root: Path | str) -> tuple[list[Run], list[tuple[str, str]]]:
    """Every run under `root` (itself included: a directory with `.hydra/`, or with a
    metrics.csv or summary.json, so that one without `.hydra/` is reported) → (runs, skipped),
    job 10 after job 9. `skipped`: (directory, reason) of each run left out of the statistics;
    failed runs are among them and in `runs` too (`metrics=None`), so that their group counts
    them."""
    root = Path(root)
    # one walk of the tree (three rglobs took 3x as long: 23 ms for 100 runs)
    found = {Path(folder) for folder, dirs, files in os.walk(root)
             if RUN_MARKERS.intersection(dirs) or RUN_MARKERS.intersection(files)}
    runs, skipped = [], []
    for run_dir in sorted(found, key=lambda p: tuple(
            (0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in p.relative_to(root).parts)):
        name = str(run_dir.relative_to(root))
        try:
            run = read_run(run_dir, name)
        except Unreadable as reason:
            skipped.append((name, str(reason)))
            continue
        runs.append(run)
        if run.status == "failed":
            skipped.append((name, f"failed: {run.summary.get('error', 'no error recorded')}"))
    return runs, skipped


def read_run(run_dir: Path, name: str = ".") -> Run:
    """One run directory → Run; raises Unreadable with the reason."""
    hydra_dir = run_dir / ".hydra"
    if not hydra_dir.is_dir():
        raise Unreadable("no .hydra/ (not a Hydra run directory)")
    overrides = parse_overrides(_read_yaml(hydra_dir / "overrides.yaml", list))
    summary = read_summary(run_dir / "summary.json")
    config = summary.get("config") or {}  # the composed config, as in .hydra/config.yaml
    if not config and (hydra_dir / "config.yaml").exists():  # a run that wrote no summary
        config = _read_yaml(hydra_dir / "config.yaml", dict)
    status = summary.get("status", "unknown")
    if status == "failed":
        return Run(name, overrides, config, summary, status)
    if (run_dir / "metrics.csv").exists():
        # a killed run may have died while writing a row: drop that row, keep the rest
        metrics = read_metrics(run_dir / "metrics.csv",
                               partial_last_row=status in ("running", "unknown"))
    else:
        metrics = read_events(run_dir)
    return Run(name, overrides, config, summary, status, metrics)


def _read_yaml(path: Path, kind: type) -> Any:
    name = f"{path.parent.name}/{path.name}"
    try:
        data = yaml.load(path.read_text(), Loader=YAML_LOADER)
    except FileNotFoundError:
        raise Unreadable(f"no {name}") from None
    except yaml.YAMLError as exc:
        raise Unreadable(f"{name} is not YAML ({exc.__class__.__name__})") from None
    if not isinstance(data, kind):
        raise Unreadable(f"{name} is not a YAML {kind.__name__}")
    return data


def read_summary(path: Path) -> dict[str, Any]:
    """summary.json as a dict; {} when absent (a run killed before writing it)."""
    if not path.exists():
        return {}
    try:
        summary = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Unreadable(f"summary.json is not JSON ({exc})") from None
    if not isinstance(summary, dict):
        raise Unreadable("summary.json is not a JSON object")
    return summary


def parse_overrides(overrides: list[str]) -> dict[str, str]:
    """Hydra's override strings → {key: value as written}. `+key=v`, `++key=v` and `~key=v`
    lose their prefix; `~key` (a deletion, no value) becomes {key: "~"}."""
    parsed = {}
    for override in map(str, overrides):
        key, has_value, value = override.partition("=")
        parsed[key.lstrip("+~")] = value if has_value else "~"
    return parsed


def read_metrics(path: Path, partial_last_row: bool = False) -> pd.DataFrame:
    """metrics.csv → DataFrame, one row per step. Every line must have the header's number of
    fields (pandas would silently pad a short one with NaN, which reads like a diverged loss);
    with `partial_last_row` an unfinished last line is dropped instead of refused."""
    text = path.read_text(errors="replace")
    if not text.strip():
        raise Unreadable("metrics.csv is empty")
    lines = text.splitlines()
    fields = lines[0].count(",")
    if partial_last_row and (not text.endswith("\n") or lines[-1].count(",") != fields):
        lines = lines[:-1]
    elif not text.endswith("\n"):
        raise Unreadable("metrics.csv is truncated (its last line is unfinished)")
    body = "\n".join(lines)
    if body.count(",") != fields * len(lines):  # one C-speed count; look for the line if off
        line = next(i for i, line in enumerate(lines) if line.count(",") != fields)
        raise Unreadable(f"metrics.csv is truncated or corrupt (line {line + 1} has "
                         f"{lines[line].count(',') + 1} fields, the header {fields + 1})")
    try:
        table = pd.read_csv(io.StringIO(body))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        raise Unreadable(f"metrics.csv is corrupt ({exc})") from None
    # the table holds float32 values in nine digits: read back as float32 they are the run's
    # own numbers (as a float64 parse they differ in the ninth digit from summary.json's).
    # One NumPy block: casting column by column costs 5 ms a run. (A column with text in it
    # is left as read, for the checks below.)
    if all(dtype.kind in "iuf" for dtype in table.dtypes):  # numbers only
        step = table["step"].to_numpy() if "step" in table.columns else None
        values = table.to_numpy(np.float32).astype(float, order="F")  # F: columns contiguous
        table = pd.DataFrame(values, columns=table.columns)
        if step is not None:
            table["step"] = step
    return _checked(table, "metrics.csv")


def read_events(run_dir: Path) -> pd.DataFrame:
    """The run's TensorBoard event files → the same table as metrics.csv (slow, loads
    TensorFlow: only for a run without metrics.csv)."""
    if not list(run_dir.glob("events.out.tfevents.*")):
        raise Unreadable("no metrics.csv and no event files")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    # the reader loads TensorFlow on Reload; loaded first through gradexp._tf, it stays quiet
    import gradexp._tf  # noqa: F401

    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    try:
        events.Reload()
    except Exception as exc:  # a corrupt event file raises anything from proto decoding
        raise Unreadable(f"event files unreadable ({exc.__class__.__name__}: {exc})") from None
    columns = {}
    for tag in events.Tags()["tensors"]:
        if (events.SummaryMetadata(tag).plugin_data.plugin_name != "scalars"
                or tag.startswith("final/")):  # histograms, HParams; the run's final figures
            continue
        values = {e.step: float(make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)}
        columns[tag] = pd.Series(values, dtype=float)
    if LOSS not in columns:
        raise Unreadable(f"no metrics.csv, and the event files have no {LOSS}")
    table = pd.DataFrame(columns).sort_index().rename_axis("step").reset_index()
    return _checked(table, "event files")


def _checked(table: pd.DataFrame, source: str) -> pd.DataFrame:
    missing = [c for c in ("step", LOSS) if c not in table.columns]
    if missing:
        raise Unreadable(f"{source} has no column {', '.join(missing)}")
    if table.empty:
        raise Unreadable(f"{source} has no steps")
    step = pd.to_numeric(table["step"], errors="coerce")
    if step.isna().any() or not step.is_monotonic_increasing or not step.is_unique:
        raise Unreadable(f"{source}: the step column is not increasing whole numbers")
    # astype copies the whole table (~2 ms a run): only if the steps are not integers yet
    return table if pd.api.types.is_integer_dtype(step) else table.astype({"step": int})


# ---------------------------------------------------------------------------------------------
# Groups: runs that differ only in their seed


def grouping_keys(runs: list[Run]) -> list[str]:
    """The override keys, in order of appearance, that differ between runs, except the seed,
    Hydra's own (`hydra/...`, `hydra.*`) and the names of presets that set nothing the other
    keys do not (`only_names_a_preset`); [`sweep`] (one group, `sweep=all`) if none."""
    keys = [k for k in dict.fromkeys(key for run in runs for key in run.overrides)
            if k != SEED_KEY and k != "hydra" and not k.startswith(("hydra/", "hydra."))
            and len({run.overrides.get(k) for run in runs}) > 1]
    return [k for k in keys if not only_names_a_preset(runs, k, keys)] or [ONE_GROUP]


def only_names_a_preset(runs: list[Run], key: str, keys: list[str]) -> bool:
    """Whether `key` is no value of any run's config (a preset: `+experiment=exploding_rnn`)
    and runs that agree on the other keys have the same config whatever its value (but the
    seed): then it names runs, it does not set them apart (two preset sweeps of one model)."""
    if any(_from_config(run.config, key) != UNSET for run in runs):
        return False
    others = group_values(runs, [k for k in keys if k != key]).drop(columns=SEED_KEY)
    config_of: dict[tuple, str] = {}
    for values, run in zip(others.itertuples(index=False), runs, strict=True):
        config = json.dumps({k: v for k, v in run.config.items() if k != SEED_KEY},
                            sort_keys=True, default=str)
        if config_of.setdefault(tuple(values), config) != config:
            return False
    return True


def group_values(runs: list[Run], keys: list[str]) -> pd.DataFrame:
    """One row per run, one string column per key and `seed`: each value as written in the run's
    overrides, else taken from its config (a config group such as `model` by its `name`). A
    config value takes the spelling that other runs wrote for the same value (`null`, `0.1`),
    so that `clip=null` and a run without a clip override land in the same group."""
    table = pd.DataFrame(
        [["all" if key == ONE_GROUP else run.overrides[key] if key in run.overrides
          else _from_config(run.config, key) for key in [*keys, SEED_KEY]] for run in runs],
        columns=[*keys, SEED_KEY], dtype=object)
    for column in table:
        written = {v for run in runs if (v := run.overrides.get(column)) is not None}
        from_config = [run.overrides.get(column) is None for run in runs]
        table.loc[from_config, column] = [_spelled_as(v, written)
                                          for v in table.loc[from_config, column]]
    return table.map(_as_text)


def _from_config(config: dict[str, Any], key: str) -> Any:
    """The config's value at `key` (a config group, such as `model`, by its `name`)."""
    node: Any = config
    for part in key.replace("/", ".").split("."):
        if not isinstance(node, dict) or part not in node:
            return UNSET
        node = node[part]
    return node.get("name", UNSET) if isinstance(node, dict) else node


def _spelled_as(value: Any, written: set[str]) -> Any:
    """`value` as some run wrote it in its overrides (None as `null`), else itself."""
    for text in written:
        try:
            parsed = yaml.load(text, Loader=YAML_LOADER)
            parsed = float(parsed) if isinstance(parsed, str) else parsed  # YAML 1.1: "1e-3"
        except (yaml.YAMLError, ValueError):
            parsed = text
        if parsed == value:
            return text
    return value


def _as_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(map(_as_text, value)) + "]"
    return str(value)


# ---------------------------------------------------------------------------------------------
# Per-run metrics: one function each, on numpy arrays (pandas' per-call overhead would dominate).
# A diverged run is measured on its steps before the divergence (`steps_before_divergence`).


def trailing_mean(x: np.ndarray, window: int) -> np.ndarray:
    """m_t = mean(x_{t-window+1} … x_t) over the up-to-`window` values that exist (m_1 = x_1)."""
    sums = np.concatenate([[0.0], np.cumsum(x)])
    t = np.arange(1, len(x) + 1)
    start = np.maximum(t - window, 0)
    return (sums[t] - sums[start]) / (t - start)


def table_divergence_step(table: pd.DataFrame, factor: float,
                          reported_step: float = math.nan) -> float:
    """The earliest of the step the run reported (summary.json) and `divergence_step` of its
    table (a table without gradient norms: the loss alone decides)."""
    loss = table[LOSS].to_numpy(float)
    norm = table[GRAD_NORM].to_numpy(float) if GRAD_NORM in table else np.zeros(len(loss))
    skipped = table["skipped"].to_numpy(float) if "skipped" in table else np.zeros(len(loss))
    found = divergence_step(table["step"].to_numpy(), loss, norm, skipped, factor)
    return float(np.fmin(found, reported_step))


def steps_before_divergence(table: pd.DataFrame, diverged_at: float) -> pd.DataFrame:
    """The rows with step < diverged_at (all rows when the run did not diverge)."""
    if math.isnan(diverged_at):
        return table
    return table.iloc[: int(np.searchsorted(table["step"].to_numpy(), diverged_at))]


def last_evaluated(values: np.ndarray) -> float:
    """The last value that is not blank (validation columns are filled at evaluation steps)."""
    values = np.asarray(values, float)
    evaluated = values[~np.isnan(values)]
    return float(evaluated[-1]) if len(evaluated) else math.nan


def loss_spikes(loss: np.ndarray, factor: float = 2.0, window: int = 20,
                min_rise: float = 0.05) -> float:
    """#{t ≥ 2 : loss_t > factor · m_t  and  loss_t − m_t > min_rise · loss_1}, m_t the mean of
    the up-to-`window` losses before step t: a loss `factor` times the recent mean, by more than
    `min_rise` of the first loss (batch noise on a loss near zero doubles easily)."""
    loss = np.asarray(loss, float)
    preceding_mean = trailing_mean(loss, window)[:-1]  # of steps ≤ t-1, for t = 2 … n
    rise = loss[1:] - preceding_mean
    return float(np.sum((loss[1:] > factor * preceding_mean) & (rise > min_rise * loss[0])))


def loss_spike_rate(loss: np.ndarray, factor: float = 2.0, window: int = 20,
                    min_rise: float = 0.05) -> float:
    """100 · loss_spikes / n: spikes per 100 of the n measured steps (a run that diverges early
    has fewer steps to spike in)."""
    return 100 * loss_spikes(loss, factor, window, min_rise) / len(loss)


def mean_loss(loss: np.ndarray) -> float:
    """mean(loss_t) over all the steps."""
    return float(np.mean(loss))


def grad_norm_mean(norm: np.ndarray) -> float:
    """mean(g) of the global gradient norm g over the steps."""
    return float(np.mean(norm))


def grad_norm_cv(norm: np.ndarray) -> float:
    """std(g) / mean(g) of the global gradient norm g over the steps (std with ddof=0)."""
    mean = np.mean(norm)
    return float(np.std(norm) / mean) if mean > 0 else math.nan


def grad_norm_p99_p50(norm: np.ndarray) -> float:
    """percentile_99(g) / percentile_50(g) (numpy's linear interpolation): how heavy the tail of
    the gradient norm is compared with its median."""
    p99, p50 = np.percentile(norm, [99, 50])
    return float(p99 / p50) if p50 > 0 else math.nan


def grad_norm_max(norm: np.ndarray) -> float:
    """max(g) over the steps."""
    return float(np.max(norm))


def clip_fraction(table: pd.DataFrame) -> float:
    """The mean over steps and over every `clip_fraction/<position>` column; 0 without any
    (no clip layer reports clipping)."""
    columns = [table[c].to_numpy(float) for c in table.columns if c.startswith("clip_fraction/")]
    return float(np.mean(columns)) if columns else 0.0


def param_clip_fraction(table: pd.DataFrame) -> float:
    """mean_t param_clip/clipped_t: the share of steps on which the parameter-clipping method
    changed the gradients; NaN without that column (runs from before it was logged)."""
    clipped = table.get("param_clip/clipped")
    return math.nan if clipped is None else float(np.mean(clipped.to_numpy(float)))


def steps_to_target(loss: np.ndarray, steps: np.ndarray, target: float,
                    window: int = 20) -> float:
    """The first step t with mean(loss_{t-window+1} … loss_t) ≤ target (a trailing mean over up
    to `window` steps, so one lucky batch does not count); NaN if never (or no target)."""
    if math.isnan(target):
        return math.nan
    reached = trailing_mean(np.asarray(loss, float), window) <= target
    return float(np.asarray(steps)[np.argmax(reached)]) if reached.any() else math.nan


def run_metrics(table: pd.DataFrame, settings: Settings = DEFAULTS, divergence_factor=1000.0,
                reported_diverged_step: float = math.nan, target_loss: float = math.nan) -> dict:
    """Every metric of one run's table (one row per step), and RUN_EXTRAS. All but `diverged`
    and `diverged_step` are measured on the steps before the divergence (none: NaN)."""
    diverged_at = table_divergence_step(table, divergence_factor, reported_diverged_step)
    part = steps_before_divergence(table, diverged_at)
    divergence = {"diverged": float(not math.isnan(diverged_at)), "diverged_step": diverged_at}
    if part.empty:  # diverged at its first step: nothing measured (no spikes is not 0 spikes)
        return {**dict.fromkeys([*METRICS, *RUN_EXTRAS], math.nan), **divergence,
                "measured_steps": 0}
    loss = part[LOSS].to_numpy(float)
    column = {c: part[c].to_numpy(float) if c in part else np.full(len(part), math.nan)
              for c in (GRAD_NORM, "loss/val", "accuracy/val")}
    norm = column[GRAD_NORM]
    spike_settings = settings.spike_factor, settings.spike_window, settings.spike_min_rise
    return {
        **divergence,
        "final_loss": final_loss(loss, settings.final_fraction),
        "val_loss": last_evaluated(column["loss/val"]),
        "val_accuracy": last_evaluated(column["accuracy/val"]),
        "loss_spike_rate": loss_spike_rate(loss, *spike_settings),
        "mean_loss": mean_loss(loss),
        "grad_norm_mean": grad_norm_mean(norm),
        "grad_norm_cv": grad_norm_cv(norm),
        "grad_norm_p99_p50": grad_norm_p99_p50(norm),
        "grad_norm_max": grad_norm_max(norm),
        "clip_fraction": clip_fraction(part),
        "param_clip_fraction": param_clip_fraction(part),
        "steps_to_target": steps_to_target(loss, part["step"].to_numpy(), target_loss,
                                           settings.spike_window),
        "loss_spikes": loss_spikes(loss, *spike_settings),
        "measured_steps": len(loss),
    }


def _divergence_factor(run: Run) -> float:
    factor = (run.config.get("trainer") or {}).get("divergence_factor")
    return 1000.0 if factor is None else float(factor)


def _reported_step(run: Run) -> float:
    """The step summary.json says the run diverged at; its last step if it says diverged
    without a step (the trainer stops at the step that diverged)."""
    step = run.summary.get("diverged_step")
    if step is None and run.summary.get("diverged"):
        step = run.metrics["step"].iloc[-1]
    return math.nan if step is None else float(step)


def per_run_table(runs: list[Run], keys: list[str], settings: Settings,
                  baseline: dict[str, str]) -> pd.DataFrame:
    """One row per run: directory, status, group values, seed, metrics (NaN for a failed run),
    target loss. The target needs every run's final loss: steps_to_target comes second."""
    rows = [run_metrics(run.metrics, settings, _divergence_factor(run), _reported_step(run))
            if run.metrics is not None else {} for run in runs]
    table = pd.concat([pd.DataFrame({"run": [r.name for r in runs],
                                     "status": [r.status for r in runs]}),
                       group_values(runs, keys),
                       pd.DataFrame(rows, columns=[*METRICS, *RUN_EXTRAS])],
                      axis=1)
    table["target_loss"] = target_losses(table, keys, baseline, settings.target_loss)
    for i, run in enumerate(runs):
        if run.metrics is not None:
            part = steps_before_divergence(run.metrics, table.at[i, "diverged_step"])
            table.at[i, "steps_to_target"] = steps_to_target(
                part[LOSS].to_numpy(float), part["step"].to_numpy(), table.at[i, "target_loss"],
                settings.spike_window)
    return table


def target_losses(table: pd.DataFrame, keys: list[str], baseline: dict[str, str],
                  fixed: float | None) -> np.ndarray:
    """The target of each run's `steps_to_target`: `fixed` if given, else the largest final
    loss among its matching baseline group's runs that did not diverge (a loss each of them
    gets down to; a diverged run's final loss is the one before its blow-up, any height); NaN
    without a baseline, or if every run of the baseline group diverged."""
    if fixed is not None or not baseline:
        return np.full(len(table), math.nan if fixed is None else float(fixed))
    finite = table[table["diverged"] == 0]
    worst = finite.groupby(keys, sort=False)["final_loss"].max().reset_index()
    partner = table[keys].assign(**baseline)
    return partner.merge(worst, on=keys, how="left")["final_loss"].to_numpy(float)


# ---------------------------------------------------------------------------------------------
# Groups against their baselines


def t_interval(mean: Any, std: Any, n: Any) -> tuple[Any, Any]:
    """95% Student-t interval of a mean over n seeds: mean ± t_{0.975, n-1} · std / √n (std with
    ddof=1); NaN when n < 2. Vectorized over arrays."""
    from scipy.special import stdtrit  # = scipy.stats.t.ppf, without stats' ~1 s import

    n = np.asarray(n, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        half = np.where(n >= 2, stdtrit(np.maximum(n - 1, 1), 0.975) * std / np.sqrt(n), np.nan)
    return mean - half, mean + half


def clopper_pearson(k: Any, n: Any) -> tuple[Any, Any]:
    """Exact 95% interval of a rate of k in n: [B⁻¹(0.025; k, n−k+1), B⁻¹(0.975; k+1, n−k)], the
    lower end 0 for k = 0 and the upper 1 for k = n (B⁻¹: the inverse of the regularized
    incomplete beta function); NaN for n = 0. Vectorized over arrays."""
    from scipy.special import betaincinv  # not scipy.stats: ~1 s to import

    k, n = np.asarray(k, float), np.asarray(n, float)
    with np.errstate(invalid="ignore"):
        low = np.where(k > 0, betaincinv(np.maximum(k, 1e-300), n - k + 1, 0.025), 0.0)
        high = np.where(k < n, betaincinv(k + 1, np.maximum(n - k, 1e-300), 0.975), 1.0)
    return np.where(n > 0, low, np.nan), np.where(n > 0, high, np.nan)


def sign_test(wins: Any, losses: Any) -> Any:
    """Exact two-sided sign test of wins against losses (ties left out): p = min(1, 2 · P(X ≤
    min(wins, losses))), X ~ Binomial(wins + losses, 1/2); 1 without either. On 0/1 values
    (`diverged`) this is the exact McNemar test on the discordant pairs. Vectorized."""
    from scipy.special import betainc  # P(X ≤ k) = I_{1/2}(m − k, k + 1) for k < m

    wins, losses = np.asarray(wins, float), np.asarray(losses, float)
    k, m = np.minimum(wins, losses), wins + losses
    with np.errstate(invalid="ignore"):
        tail = np.where(k < m, betainc(np.maximum(m - k, 1e-300), k + 1, 0.5), 1.0)
    return np.where(np.isnan(m), np.nan, np.minimum(1.0, 2 * tail))


def group_counts(runs_table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group: runs, completed (finished, not diverged), diverged, failed and incomplete
    (killed or still running, not diverged)."""
    failed = runs_table["status"] == "failed"
    diverged = (runs_table["diverged"] == 1) & ~failed
    finished = runs_table["status"].isin(["completed", "diverged"])
    outcome = pd.DataFrame({
        "runs": 1, "completed": finished & ~diverged, "diverged": diverged, "failed": failed,
        "incomplete": ~finished & ~failed & ~diverged}).astype(int)
    return outcome.groupby([runs_table[k] for k in keys], sort=False).sum()


def compare(per_seed: pd.DataFrame, keys: list[str],
            baseline: dict[str, str]) -> pd.DataFrame:
    """One row per (group, metric): n seeds, mean, std and 95% interval over seeds (for
    `diverged`, Clopper–Pearson's); and against the matching baseline group (same values of the
    other keys, every baseline key at its baseline value), over the seeds both groups have: the
    paired differences d_s = group_s − baseline_s (mean; 95% t interval but for `diverged`),
    wins, ties, losses, win rate = wins / paired seeds and the sign test of wins against losses,
    a win being a seed where the group is better (a missing value, e.g. target never reached,
    counts as worse than any value; equal values are ties)."""
    long = per_seed.melt(ignore_index=False, var_name="metric").reset_index()
    by = [*keys, "metric"]
    stats = long.groupby(by, sort=False)["value"].agg(n="count", mean="mean", std="std")
    stats["ci_low"], stats["ci_high"] = t_interval(stats["mean"], stats["std"], stats["n"])
    rate = stats.index.get_level_values("metric") == "diverged"  # 0/1: no t interval
    stats.loc[rate, "ci_low"], stats.loc[rate, "ci_high"] = clopper_pearson(
        (stats["mean"] * stats["n"])[rate].round(9), stats["n"][rate])
    stats.insert(0, "better", stats.index.get_level_values("metric").map(METRICS))
    if not baseline:
        return stats.reset_index()
    columns = [*keys, SEED_KEY, "metric"]
    partner = long[columns].assign(**baseline).merge(long[[*columns, "value"]], how="left",
                                                     on=columns, indicator=True)
    long["baseline_value"] = partner["value"].to_numpy()
    in_baseline = (long[list(baseline)] == pd.Series(baseline)).all(axis=1)
    long["paired"] = (partner["_merge"] == "both").to_numpy() & ~in_baseline
    long["baseline"] = [_label(dict(zip(keys, row, strict=True)))
                        for row in partner[keys].to_numpy()]
    paired = long[long["paired"]].copy()
    paired["diff"] = paired["value"] - paired["baseline_value"]
    paired["win"], paired["tie"] = _wins(paired)
    diff = paired.groupby(by, sort=False).agg(
        baseline=("baseline", "first"), n_paired=("seed", "count"), n_diff=("diff", "count"),
        diff_mean=("diff", "mean"), diff_std=("diff", "std"), wins=("win", "sum"),
        ties=("tie", "sum"))
    diff["diff_ci_low"], diff["diff_ci_high"] = t_interval(diff["diff_mean"], diff["diff_std"],
                                                           diff["n_diff"])
    metric = diff.index.get_level_values("metric")
    diff.loc[metric == "diverged", ["diff_ci_low", "diff_ci_high"]] = np.nan
    has_better = metric.map(METRICS).notna()
    diff["losses"] = diff["n_paired"] - diff["wins"] - diff["ties"]
    diff["win_rate"] = (diff["wins"] / diff["n_paired"]).where(has_better)
    diff["sign_p"] = sign_test(diff["wins"], diff["losses"])
    diff.loc[~has_better, ["wins", "ties", "losses", "sign_p"]] = np.nan
    return stats.join(diff.drop(columns="diff_std")).reset_index()


def _wins(paired: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per paired seed: is the group better than its baseline, and is it a tie."""
    g, b = paired["value"].to_numpy(float), paired["baseline_value"].to_numpy(float)
    sign = paired["metric"].map(METRICS).map({"lower": -1.0, "higher": 1.0}).to_numpy(float)
    g_missing, b_missing = np.isnan(g), np.isnan(b)
    with np.errstate(invalid="ignore"):
        better = sign * (g - b) > 0
    win = (better & ~g_missing & ~b_missing) | (~g_missing & b_missing)
    tie = (g == b) | (g_missing & b_missing)
    return win, tie


def _label(values: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items())


def summarize(runs: list[Run], settings: Settings = DEFAULTS,
              baseline: dict[str, str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs → (per-run table, tidy summary: one row per group × metric with the group's counts)."""
    keys, baseline = grouping_keys(runs), baseline or {}
    runs_table = per_run_table(runs, keys, settings, baseline)
    measured = runs_table[runs_table["status"] != "failed"]  # runs sharing a seed: their mean
    tidy = compare(measured.groupby([*keys, SEED_KEY], sort=False)[list(METRICS)].mean(), keys,
                   baseline)
    counts = group_counts(runs_table, keys)
    counts["target_loss"] = runs_table.groupby(keys, sort=False)["target_loss"].first()
    # every group × metric, in order (a left merge keeps the grid's); a group with only failed
    # runs gets rows too, so that its counts show
    groups = counts.index.to_frame(index=False)
    groups = groups.iloc[sorted(range(len(groups)), key=lambda i: tuple(
        _natural_value(groups.at[i, k], baseline.get(k)) for k in keys))]
    grid = groups.merge(pd.DataFrame({"metric": list(METRICS)}), how="cross")
    tidy = grid.merge(tidy, on=[*keys, "metric"], how="left")
    tidy["better"] = tidy["metric"].map(METRICS)
    tidy["n"] = tidy["n"].fillna(0).astype(int)
    tidy = tidy.merge(counts.reset_index(), on=keys, how="left")
    rate = tidy.loc[tidy["metric"] == "diverged", [*keys, "mean", "ci_low", "ci_high"]]
    tidy = tidy.merge(rate.set_axis([*keys, "divergence_rate", "divergence_ci_low",
                                     "divergence_ci_high"], axis=1), on=keys, how="left")
    tidy["group"] = [_label(dict(zip(keys, row, strict=True))) for row in tidy[keys].to_numpy()]
    return runs_table, tidy.reindex(columns=[*keys, "group", *SUMMARY_COLUMNS])


def _natural_value(value: str, baseline_value: str | None) -> tuple:
    """Sort order of a key's values: the baseline first, then numbers by size, then text."""
    if value == baseline_value:
        return (0, 0.0, "")
    try:
        return (1, float(value), "")
    except ValueError:
        return (2, 0.0, value)


# ---------------------------------------------------------------------------------------------
# Output: the printed table, summary.md (summary.csv and runs.csv are the tables themselves)


def varying_keys(tidy: pd.DataFrame, keys: list[str], baseline: dict[str, str]) -> list:
    """The keys whose value differs between groups (and the baseline keys): the ones worth a
    column; keys fixed for the whole sweep (e.g. trainer.steps=100) are stated once instead."""
    return [k for k in keys if tidy[k].nunique() > 1 or k in baseline] or keys


def _number(x: float, digits: int = 3) -> str:
    """`digits` significant digits, but whole numbers (and anything ≥ 100) without decimals
    or exponent: steps read as 955, not 9.55e+02."""
    if pd.isna(x):
        return "—"
    if (float(x).is_integer() or abs(x) >= 100) and abs(x) < 1e9:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "") + _number(x)


def _mean_cell(row: pd.Series, seeds: int) -> str:
    """`mean±half-width`, with `[n=k]` when only k of the group's seeds have a value."""
    if row["n"] == 0:
        return "—"
    cell = _number(row["mean"])
    if not pd.isna(row["ci_high"]):
        cell += f"±{_number(row['ci_high'] - row['mean'], 2)}"
    return cell + (f" [n={row['n']}]" if row["n"] < seeds else "")


def _rate_cell(row: pd.Series) -> str:
    """`k/n [low, high]`: seeds diverged of seeds measured, the exact 95% interval."""
    if row["n"] == 0:
        return "—"
    diverged = _number(row["mean"] * row["n"])
    return f"{diverged}/{row['n']} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"


def _diff_cell(row: pd.Series, baseline: dict[str, str]) -> str:
    """`Δmean±half-width wins/pairs`, for `diverged` `Δrate (k saved, l lost, p=sign test)`;
    `base` in a baseline group."""
    if all(row[k] == v for k, v in baseline.items()):
        return "base"
    if pd.isna(row.get("n_paired")) or not row["n_paired"]:
        return "no pair"
    cell = "—" if pd.isna(row["diff_mean"]) else _signed(row["diff_mean"])
    if row.name == "diverged":
        return (f"{cell} ({int(row['wins'])} saved, {int(row['losses'])} lost, "
                f"p={_number(row['sign_p'], 2)})")
    if not pd.isna(row["diff_ci_high"]):
        cell += f"±{_number(row['diff_ci_high'] - row['diff_mean'], 2)}"
    if not pd.isna(row["win_rate"]):
        cell += f" {int(row['wins'])}/{int(row['n_paired'])}"
    return cell


def printed_metrics(tidy: pd.DataFrame) -> list[str]:
    """The metrics of the printed table: `val_accuracy`, or `val_loss` if no group has an
    accuracy (regression), or both if only some groups have one; `param_clip_fraction` if some
    run logged it."""
    def measured(metric: str) -> np.ndarray:  # per group: does some seed have a value
        return tidy.loc[tidy["metric"] == metric, "n"].to_numpy() > 0

    accuracy, loss = measured("val_accuracy"), measured("val_loss")
    val = (["val_loss"] if not accuracy.any() else
           ["val_accuracy"] if (accuracy | ~loss).all() else ["val_loss", "val_accuracy"])
    param = ["param_clip_fraction"] if measured("param_clip_fraction").any() else []
    return ["final_loss", *val, "loss_spike_rate", "grad_norm_cv", "steps_to_target",
            "clip_fraction", *param]


def group_table(tidy: pd.DataFrame, keys: list[str], baseline: dict[str, str],
                metrics: list[str] | None = None) -> pd.DataFrame:
    """One row per group: its varying keys, runs, diverged seeds/measured seeds [95% interval]
    (and against the baseline: Δ rate, seeds saved and lost, sign test), then per metric
    `mean±half-width` of the 95% interval over seeds and `Δmean±half-width wins/pairs`."""
    shown, metrics = varying_keys(tidy, keys, baseline), metrics or printed_metrics(tidy)
    rows = []
    for _, group in tidy.groupby("group", sort=False):
        first = group.iloc[0]
        row = {k: first[k] for k in shown}
        row["runs"] = int(first["runs"])
        by_metric = group.set_index("metric")
        row["diverged"] = _rate_cell(by_metric.loc["diverged"])
        if baseline:
            row["Δ diverged"] = _diff_cell(by_metric.loc["diverged"], baseline)
        for metric in metrics:
            row[metric] = _mean_cell(by_metric.loc[metric], by_metric.at["diverged", "n"])
            if baseline and METRICS[metric] is not None:
                row[f"Δ {metric}"] = _diff_cell(by_metric.loc[metric], baseline)
        row["notes"] = ", ".join(f"{int(first[c])} {c}" for c in ("failed", "incomplete")
                                 if first[c])
        rows.append(row)
    table = pd.DataFrame(rows)
    return table if table["notes"].any() else table.drop(columns="notes")


def metric_table(tidy: pd.DataFrame, keys: list[str], metric: str,
                 baseline: dict[str, str]) -> pd.DataFrame:
    """One metric, one row per group: n, mean, 95% CI; against the baseline: paired seeds, Δ
    mean and its CI, and (a metric with a direction) wins, ties, losses, win rate, sign test."""
    rows = tidy[tidy["metric"] == metric]
    columns = {"n": rows["n"], "mean": rows["mean"].map(_number), "95% CI": _intervals(rows, "ci")}
    if baseline:
        columns |= {"paired": rows["n_paired"].map(_number), "Δ mean": rows["diff_mean"].map(
            _signed), "Δ 95% CI": _intervals(rows, "diff_ci")}
    if baseline and METRICS[metric]:
        columns |= {c: rows[c].map(_number) for c in ("wins", "ties", "losses")}
        columns["win rate"] = rows["win_rate"].map(lambda x: _number(x * 100) + "%" * (x >= 0))
        columns["sign p"] = rows["sign_p"].map(lambda x: _number(x, 2))
    return rows[varying_keys(tidy, keys, baseline)].assign(**columns)


def _intervals(rows: pd.DataFrame, prefix: str) -> list[str]:
    return ["—" if pd.isna(low) else f"[{_number(low)}, {_number(high)}]"
            for low, high in zip(rows[f"{prefix}_low"], rows[f"{prefix}_high"], strict=True)]


def markdown_report(tidy: pd.DataFrame, keys: list[str], baseline: dict[str, str],
                    settings: Settings, skipped: list[tuple[str, str]], root: Path) -> str:
    """summary.md: the settings, the key table, one table per metric, the skipped runs."""
    fixed = [k for k in keys if k not in varying_keys(tidy, keys, baseline)]
    lines = [f"# Sweep summary: {root}", ""]
    if fixed:
        first = tidy.iloc[0]
        lines.append("Same in every run: " + _label({k: first[k] for k in fixed}) + "  ")
    lines.append(_comparison_note(baseline, settings) + "  ")
    lines += [f"Metrics: final fraction {settings.final_fraction}, spike factor "
              f"{settings.spike_factor}, spike window {settings.spike_window} steps, "
              f"spike minimum rise {settings.spike_min_rise} × first loss "
              "(definitions: README, \"Summarizing a sweep\").", "",
              "## Groups", "",
              group_table(tidy, keys, baseline).to_markdown(index=False), ""]
    for metric, better in METRICS.items():
        direction = {"lower": " (lower is better)", "higher": " (higher is better)"}.get(better, "")
        lines += [f"## {metric}{direction}", "",
                  metric_table(tidy, keys, metric, baseline).to_markdown(index=False), ""]
    if skipped:
        lines += ["## Skipped runs", ""] + [f"- `{d}`: {reason}" for d, reason in skipped] + [""]
    return "\n".join(lines)


def _comparison_note(baseline: dict[str, str], settings: Settings) -> str:
    if not baseline:
        return "No baseline (pass --baseline KEY=VALUE): no comparisons."
    setting = ",".join(f"{k}={v}" for k, v in baseline.items())
    target = (f"target loss {settings.target_loss}" if settings.target_loss is not None else
              "target loss: the worst final loss of the matching baseline group's runs that "
              "did not diverge")
    return (f"Baseline {setting}: each group against the group with the same other values "
            f"and {setting}, paired by seed; Δ = group − baseline, mean ± 95% t interval "
            f"over paired seeds, wins/pairs; diverged: seeds diverged/seeds [exact 95% "
            f"interval], Δ diverged: difference of the rates over paired seeds, seeds saved "
            f"(baseline diverged, group did not) and lost, p of the exact sign test; {target}.")


# ---------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gradexp.summarize",
        description="Compare each setting of a sweep with its unclipped baseline, seed by seed.",
        epilog="Definitions: README, \"Summarizing a sweep\". Writes summary.csv, summary.md, "
               "runs.csv.")
    parser.add_argument("dir", type=Path, metavar="DIR",
                        help="a sweep, or any folder holding run directories (recursively)")
    parser.add_argument("--baseline", metavar="KEY=VALUE[,KEY=VALUE]", type=_baseline_arg,
                        help="the baseline setting (default: clip=null and/or clipping=none)")
    parser.add_argument("--target-loss", type=float, metavar="LOSS",
                        help="the loss of steps_to_target (default: from the baseline's runs)")
    parser.add_argument("--final-fraction", type=_in_range(float, 1), default=0.1, metavar="F",
                        help="final_loss averages the last F of the steps (default: 0.1)")
    parser.add_argument("--spike-factor", type=_in_range(float), default=2.0, metavar="X",
                        help="a spike is a loss above X × the preceding window's mean (default: 2)")
    parser.add_argument("--spike-window", type=_in_range(int), default=20, metavar="N",
                        help="the trailing window of spikes and steps_to_target (default: 20)")
    parser.add_argument("--spike-min-rise", type=_in_range(float, 1), default=0.05, metavar="R",
                        help="and by more than R × the first loss (default: 0.05)")
    parser.add_argument("--plots", action="store_true", help="also write the PNGs")
    parser.add_argument("--out", type=Path, metavar="OUT", help="where to write (default: DIR)")
    return parser.parse_args(argv)


def _baseline_arg(text: str) -> dict[str, str]:
    """`clip=null,clipping=none` → {"clip": "null", "clipping": "none"}; a comma inside brackets
    belongs to its value (`layer.positions=[a,b]`)."""
    pairs = {}
    for pair in re.split(r",(?![^\[]*\])", text):
        key, has_value, value = pair.partition("=")
        if not has_value or not key or key in pairs:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected KEY=VALUE[,KEY=VALUE...], each key once, e.g. clip=null")
        pairs[key] = value
    return pairs


def _in_range(kind: type, high: float = math.inf):
    """An argparse type: a `kind` in (0, high]."""
    def parse(text: str):
        value = kind(text)
        if not 0 < value <= high:
            raise argparse.ArgumentTypeError(
                f"{text}: must be " + ("positive" if high == math.inf else f"in (0, {high}]"))
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its "invalid ... value" error
    return parse


class UsageError(Exception):
    """A problem with the user's input: main prints `error: <message>` and exits with 2."""


def choose_baseline(requested: dict[str, str] | None, values: pd.DataFrame,
                    keys: list[str]) -> dict[str, str]:
    """The requested baseline, checked against the runs' group values; by default each of
    clip=null and clipping=none whose key is swept and whose value a run has ({}: none)."""
    if requested is None:
        return {k: v for k, v in DEFAULT_BASELINE.items()
                if k in keys and (values[k] == v).any()}
    for key, value in requested.items():
        if key not in keys:
            swept = ("no key but the seed varies" if keys == [ONE_GROUP]
                     else "keys: " + ", ".join(keys))
            raise UsageError(f"--baseline {key}={value}: {key} is not a swept key ({swept})")
        if not (values[key] == value).any():
            raise UsageError(f"--baseline {key}={value}: no run has {key}={value} "
                             f"({key} values: {', '.join(sorted(values[key].unique()))})")
    return requested


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return _main(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    root: Path = args.dir
    if not root.is_dir():
        raise UsageError(f"{root}: no such directory")
    runs, skipped = load_runs(root)
    for name, reason in skipped:
        print(f"skipped {name}: {reason}")
    if not any(run.metrics is not None for run in runs):
        raise UsageError(f"{root}: no readable runs"
                         + (f" ({len(skipped)} skipped)" if skipped else ""))
    settings = Settings(args.final_fraction, args.spike_factor, args.spike_window,
                        args.spike_min_rise, args.target_loss)
    keys = grouping_keys(runs)
    baseline = choose_baseline(args.baseline, group_values(runs, keys), keys)
    runs_table, tidy = summarize(runs, settings, baseline)
    print(_comparison_note(baseline, settings))
    print(group_table(tidy, keys, baseline).to_markdown(index=False, tablefmt="simple"))
    out = args.out or root
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "summary.csv", out / "summary.md", out / "runs.csv"]
    tidy.to_csv(written[0], index=False)
    written[1].write_text(markdown_report(tidy, keys, baseline, settings, skipped, root))
    runs_table.to_csv(written[2], index=False)
    if args.plots:
        from gradexp.plots import plot_all

        written += plot_all(runs, runs_table, tidy, keys, baseline, settings, out)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
