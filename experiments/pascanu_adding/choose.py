"""The regime search's choice, by the rule DECLARED.md fixed before the runs: per regime
(model.recurrent_gain × optimizer.learning_rate), SGD-C's successes − plain SGD's over seeds
0–4; ties by SGD-C's divergences saved, then the smaller gain, then the smaller rate.

    python experiments/pascanu_adding/choose.py experiments/pascanu_adding/search/runs.csv

Writes search/choice.md beside the runs.csv it reads: the table and the chosen regime.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

GAIN, RATE, METHOD = "model.recurrent_gain", "optimizer.learning_rate", "clipping.max_norm"


def table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per regime: successes and divergences of each method, and the rule's keys."""
    plain = runs[METHOD].isna() | (runs[METHOD].astype(str) == "null")  # pandas reads null as NaN
    runs = runs.assign(method=plain.map({True: "sgd", False: "sgd_c"}))
    counts = runs.pivot_table(index=[GAIN, RATE], columns="method",
                              values=["success", "diverged"], aggfunc="sum")
    counts.columns = [f"{method}_{what}" for what, method in counts.columns]
    counts["gained"] = counts["sgd_c_success"] - counts["sgd_success"]
    counts["saved"] = counts["sgd_diverged"] - counts["sgd_c_diverged"]
    seeds = runs.groupby([GAIN, RATE])["seed"].nunique().rename("seeds")
    return counts.join(seeds).reset_index()


def choose(regimes: pd.DataFrame) -> pd.Series:
    """The declared rule: most gained, then most saved, then smaller gain, then smaller rate."""
    order = regimes.sort_values(["gained", "saved", GAIN, RATE],
                                ascending=[False, False, True, True])
    return order.iloc[0]


def main(path: str) -> None:
    regimes = table(pd.read_csv(path))
    chosen = choose(regimes)
    text = (f"{regimes.to_markdown(index=False)}\n\nChosen by the declared rule: "
            f"{GAIN}={chosen[GAIN]:g}, {RATE}={chosen[RATE]:g} (SGD-C gained "
            f"{int(chosen['gained'])} seeds over plain SGD, saved {int(chosen['saved'])} "
            "divergences).\n")
    (Path(path).parent / "choice.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1])
