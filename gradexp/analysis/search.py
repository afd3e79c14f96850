"""A search's history and its best value (`hydra/sweeper=optuna`): its search.csv
(gradexp.runs.search_record) joined with its runs' summaries.

Each trial's seeds are re-measured from their runs (measures.search_objective, the sweeper's
rule, on summary.json as it is now): mean, standard deviation (ddof 1) and range over seeds.
Trials rank by value (lower is better); a trial with a diverged seed has value +inf and ranks
after every trial without one, then by how many of its seeds diverged; a trial that failed
(a crashed run) ranks last.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from gradexp.analysis.runs import YAML_LOADER, Run
from gradexp.runs import rundir
from gradexp.runs.measures import search_objective
from gradexp.runs.search_record import SEARCH_RECORD, searched_keys

MULTIRUN = rundir.SWEEP_RECORD  # Hydra's record of the sweep, at its root
DEFAULT_OBJECTIVE = "final_loss"


def objective_of(root: Path) -> str:
    """The search's objective, as its multirun.yaml says (hydra.sweeper.objective)."""
    try:
        config = yaml.load((root / MULTIRUN).read_text(), Loader=YAML_LOADER) or {}
    except (OSError, yaml.YAMLError):
        return DEFAULT_OBJECTIVE
    return (config.get("hydra", {}).get("sweeper", {}) or {}).get("objective", DEFAULT_OBJECTIVE)


def search_table(root: Path, runs: list[Run]) -> pd.DataFrame | None:
    """One row per trial in the order they ran, with its rank, or None if `root` is not a
    search. Columns: rank, trial, <searched keys>, <objective> (mean over seeds; inf: a seed
    diverged), sd, min, max (over the seeds that did not diverge), seeds, diverged, state.
    Trials with as many diverged seeds rank by the mean of their other seeds."""
    path = root / SEARCH_RECORD
    if not path.is_file():
        return None
    record = pd.read_csv(path, dtype={"values": str, "jobs": str}, keep_default_na=False)
    keys, objective = searched_keys(list(record.columns)), objective_of(root)
    by_name = {run.name: run for run in runs}
    rows, spread = [], []
    for _, trial in record.iterrows():
        names = str(trial["jobs"]).split()
        values = [search_objective(by_name[n].summary, objective) if n in by_name else None
                  for n in names]
        finite = [v for v in values if v is not None and math.isfinite(v)]
        diverged = sum(v == math.inf for v in values)
        failed = not values or any(v is None for v in values)
        mean = math.nan if failed else math.inf if diverged else float(np.mean(finite))
        spread.append(finite)
        rows.append({"trial": int(trial["trial"]), **{k: trial[k] for k in keys},
                     objective: mean,
                     "sd": float(np.std(finite, ddof=1)) if len(finite) > 1 else math.nan,
                     "min": min(finite) if finite else math.nan,
                     "max": max(finite) if finite else math.nan,
                     "seeds": len(values), "diverged": diverged,
                     "state": "fail" if failed else "complete"})
    table = pd.DataFrame(rows)
    finite_mean = [float(np.mean(s)) if s else math.inf for s in spread]
    order = sorted(range(len(table)), key=lambda i: (
        table["state"][i] == "fail", table[objective][i], table["diverged"][i],
        finite_mean[i], table["trial"][i]))
    table.insert(0, "rank", 0)
    table.loc[order, "rank"] = np.arange(1, len(table) + 1)
    return table


def best_line(table: pd.DataFrame) -> str:
    """The best trial in one line: its values, its objective's mean, sd and range over seeds."""
    objective = table.columns[table.columns.get_loc("sd") - 1]
    keys = list(table.columns[2:table.columns.get_loc(objective)])
    best = table[table["rank"] == 1].iloc[0]
    if not math.isfinite(best[objective]):
        return "best: none (every trial had a diverged or failed run)"
    point = ", ".join(f"{k}={_value(best[k])}" for k in keys)
    spread = (f", sd {best['sd']:.4g} over {best['seeds']} seeds "
              f"(from {best['min']:.4g} to {best['max']:.4g})" if best["seeds"] > 1 else
              " (one seed)")
    return f"best: {point} (trial {best['trial']}): {objective} {best[objective]:.4g}{spread}"


def search_report(table: pd.DataFrame) -> str:
    """The history table and the best line, as printed and as summary.md's last section."""
    objective = table.columns[table.columns.get_loc("sd") - 1]
    shown = table.copy()
    for key in shown.columns[2:shown.columns.get_loc("seeds")]:
        shown[key] = shown[key].map(_value)
    title = (f"search: {len(table)} trials in the order they ran; {objective}: the mean over a "
             "trial's seeds (inf: a seed diverged, ranked last); sd, min, max: over the seeds "
             "that did not diverge")
    return "\n".join([title, shown.to_markdown(index=False, tablefmt="simple"),
                      best_line(table)])


def _value(x) -> str:
    if isinstance(x, float):
        return "—" if math.isnan(x) else f"{x:.4g}"
    return str(x)
