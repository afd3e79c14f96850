"""search.csv at a search's sweep root: its history, one row per trial in the order they ran.

    trial     Optuna's trial number (0, 1, ...)
    state     complete | fail (a run of the trial crashed: the trial has no value)
    value     the trial's value (measures.trial_objective: mean over seeds; inf: a seed diverged)
    <key>     one column per searched key: the trial's value of it
    seeds     runs of the trial;  diverged: how many of them diverged
    values    each run's measures.search_objective, space-separated, in the order of `jobs`
    jobs      each run's directory, relative to the sweep root, space-separated

Rewritten atomically after each batch of trials: a search cut short keeps the trials it ran.
The standard library only: the sweeper writes it, gradexp.analysis reads it.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

SEARCH_RECORD = "search.csv"
FIRST, LAST = ["trial", "state", "value"], ["seeds", "diverged", "values", "jobs"]


def write(sweep_dir: Path, keys: list[str], rows: list[dict]) -> Path:
    """Write (replace) the record of `rows` (dicts with FIRST, `keys` and LAST)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, FIRST + keys + LAST, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path = Path(sweep_dir) / SEARCH_RECORD
    tmp = path.with_suffix(".csv.tmp")
    tmp.write_text(out.getvalue())
    os.replace(tmp, path)
    return path


def searched_keys(header: list[str]) -> list[str]:
    """The searched keys among a record's columns."""
    return [c for c in header if c not in FIRST + LAST]
