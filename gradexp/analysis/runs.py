"""Finding and reading run directories: every run under a folder (`load_runs`), one run
(`read_run`: its overrides, config, summary.json, status, per-step table and provenance), or an
`Unreadable` with the reason it is left out; whether runs come from different code
(`code_versions_warning`). The names inside a run directory are gradexp.runs.rundir's.
TensorFlow loads only to read the event files of a run without metrics.csv (`read_events`).
"""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from gradexp.runs import rundir

YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # ~10x faster than pure Python
LOSS, GRAD_NORM = "loss/train", "grad_norm/global"  # columns of a run's per-step table
UNKNOWN = "unknown"  # the status of a run without summary.json (as rundir.read_status says)


@dataclass
class Run:
    """One readable run directory; `metrics` is None for a failed run (counted, not measured)."""

    name: str  # the directory relative to the summarized folder
    overrides: dict[str, str]
    config: dict[str, Any]
    summary: dict[str, Any]
    status: str  # one of rundir.STATUSES, or UNKNOWN (no summary.json)
    metrics: pd.DataFrame | None = field(default=None, repr=False)
    provenance: dict[str, Any] | None = field(default=None, repr=False)  # None: unknown


class Unreadable(Exception):
    """A run directory that cannot be summarized; the message is the reason shown."""


RUN_MARKERS = {rundir.HYDRA, rundir.METRICS, rundir.SUMMARY}  # a directory with one is a run


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
            rundir.job_order(part) for part in p.relative_to(root).parts)):
        name = str(run_dir.relative_to(root))
        try:
            run = read_run(run_dir, name)
        except Unreadable as reason:
            skipped.append((name, str(reason)))
            continue
        runs.append(run)
        if run.status == rundir.FAILED:
            skipped.append((name, f"failed: {run.summary.get('error', 'no error recorded')}"))
    return runs, skipped


def read_run(run_dir: Path, name: str = ".") -> Run:
    """One run directory → Run; raises Unreadable with the reason."""
    if not (run_dir / rundir.HYDRA).is_dir():
        raise Unreadable(f"no {rundir.HYDRA}/ (not a Hydra run directory)")
    overrides = parse_overrides(_read_yaml(run_dir / rundir.OVERRIDES, list))
    summary = read_summary(run_dir / rundir.SUMMARY)
    config = summary.get("config") or {}  # the composed config, as in .hydra/config.yaml
    if not config and (run_dir / rundir.CONFIG).exists():  # a run that wrote no summary
        config = _read_yaml(run_dir / rundir.CONFIG, dict)
    status = summary.get("status", UNKNOWN)
    provenance = read_provenance(run_dir / rundir.PROVENANCE)
    if status == rundir.FAILED:
        return Run(name, overrides, config, summary, status, provenance=provenance)
    if (run_dir / rundir.METRICS).exists():
        # a killed run may have died while writing a row: drop that row, keep the rest
        metrics = read_metrics(run_dir / rundir.METRICS,
                               partial_last_row=status in (rundir.RUNNING, UNKNOWN))
    else:
        metrics = read_events(run_dir)
    return Run(name, overrides, config, summary, status, metrics, provenance)


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
        raise Unreadable(f"{rundir.SUMMARY} is not JSON ({exc})") from None
    if not isinstance(summary, dict):
        raise Unreadable(f"{rundir.SUMMARY} is not a JSON object")
    return summary


def read_provenance(path: Path) -> dict[str, Any] | None:
    """provenance.json as a dict; None when absent or unreadable (a run older than it, or
    killed while writing it): its code version is unknown, which is no reason to skip it."""
    try:
        provenance = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return provenance if isinstance(provenance, dict) else None


def code_versions_warning(runs: list[Run]) -> str | None:
    """One line when the runs come from more than one commit or any from a dirty tree, with
    how many of each; None when they agree. A run resumed on other code counts under each of
    its commits; runs without provenance are counted as unknown and never cause a warning."""
    commits, dirty, diffs, unknown = Counter(), 0, set(), 0
    for run in runs:
        codes = _codes(run.provenance or {})
        known = {c["commit"] for c in codes if c.get("commit")}
        commits.update(known)
        unknown += not known
        if any(c.get("dirty") for c in codes):
            dirty += 1
            diffs.update(c["diff_sha256"] for c in codes if c.get("diff_sha256"))
    if len(commits) < 2 and not dirty:
        return None
    counts = ", ".join(f"{n} at {commit[:10]}" for commit, n in commits.most_common())
    parts = [f"{len(runs)} runs from {_count(len(commits), 'commit')} ({counts})"]
    if dirty:
        parts.append(f"{dirty} from a dirty tree ({_count(len(diffs), 'distinct diff')}, in "
                     f"the run directory's {rundir.PROVENANCE_DIFF})")
    if unknown:
        parts.append(f"{unknown} with no recorded commit")
    return "warning: " + "; ".join(parts)


def _codes(provenance: dict[str, Any]) -> list[dict[str, Any]]:
    """The `code` records of a run's start and of each resume (gradexp.runs.provenance)."""
    resumes = provenance.get("resumes")
    starts = [provenance, *(resumes if isinstance(resumes, list) else [])]
    return [s["code"] for s in starts if isinstance(s, dict) and isinstance(s.get("code"), dict)]


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


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
        raise Unreadable(f"{rundir.METRICS} is empty")
    lines = text.splitlines()
    fields = lines[0].count(",")
    if partial_last_row and (not text.endswith("\n") or lines[-1].count(",") != fields):
        lines = lines[:-1]
    elif not text.endswith("\n"):
        raise Unreadable(f"{rundir.METRICS} is truncated (its last line is unfinished)")
    body = "\n".join(lines)
    if body.count(",") != fields * len(lines):  # one C-speed count; look for the line if off
        line = next(i for i, line in enumerate(lines) if line.count(",") != fields)
        raise Unreadable(f"{rundir.METRICS} is truncated or corrupt (line {line + 1} has "
                         f"{lines[line].count(',') + 1} fields, the header {fields + 1})")
    try:
        table = pd.read_csv(io.StringIO(body))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        raise Unreadable(f"{rundir.METRICS} is corrupt ({exc})") from None
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
    return _checked(table, rundir.METRICS)


def read_events(run_dir: Path) -> pd.DataFrame:
    """The run's TensorBoard event files → the same table as metrics.csv (slow, loads
    TensorFlow: only for a run without metrics.csv)."""
    if not list(run_dir.glob(rundir.EVENTS_GLOB)):
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


