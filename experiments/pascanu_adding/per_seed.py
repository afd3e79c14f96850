"""Each run's held-out error rate over its evaluations, which runs.csv does not keep: per run of
a sweep of this study, its method, seed, status, the step it diverged at, the first and the
last evaluation under 1% misclassified, and the share misclassified at its last evaluation and
at its best.

    python experiments/pascanu_adding/per_seed.py outputs/multirun/pascanu_test \
        experiments/pascanu_adding/test/per_seed.csv

Reads the run directories (their .hydra/overrides.yaml and metrics.csv's `error_rate/val`, one
row per evaluation); the rest of a run's measures are summarize's, in runs.csv beside it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from gradexp.analysis.runs import load_runs

METHOD = "clipping.max_norm"
ERRORS = "error_rate/val"
SUCCESS_BELOW = 0.01  # the preset's dataset.success_below: the paper's 1%


def per_run(run) -> dict:
    errors = run.metrics[["step", ERRORS]].dropna()
    plain = run.overrides.get(METHOD, "null") == "null"
    under = errors[errors[ERRORS] < SUCCESS_BELOW]
    return {"method": "SGD" if plain else "SGD-C", "seed": int(run.overrides["seed"]),
            "status": run.status, "diverged_step": run.summary.get("diverged_step"),
            "evaluations": len(errors),
            "first_under_1pct": int(under["step"].iloc[0]) if len(under) else None,
            "last_under_1pct": int(under["step"].iloc[-1]) if len(under) else None,
            "last_error_rate": float(errors[ERRORS].iloc[-1]) if len(errors) else None,
            "last_step": int(errors["step"].iloc[-1]) if len(errors) else None,
            "best_error_rate": float(errors[ERRORS].min()) if len(errors) else None}


def main(sweep: str, out: str) -> None:
    runs, skipped = load_runs(sweep)
    if skipped:
        raise SystemExit(f"runs left out: {skipped}")
    table = (pd.DataFrame([per_run(run) for run in runs])
             .sort_values(["method", "seed"]).astype({"diverged_step": "Int64",
                                                      "first_under_1pct": "Int64",
                                                      "last_under_1pct": "Int64",
                                                      "last_step": "Int64"}))
    Path(out).write_text(table.to_csv(index=False))
    print(table.to_string(index=False))


if __name__ == "__main__":
    main(*sys.argv[1:3])
