"""The MNIST-1D paper's table beside this study's: the four models on the regular and the
spatially shuffled data, the paper's test accuracy and this study's accuracy, mean and 95%
interval over seeds 0–4, within 3 points of the paper or not.

    python experiments/mnist1d/paper_table.py      (paper_run.sh calls it)

Reads paper/summary.csv (gradexp.summarize: metric `val_accuracy`, at each run's last
evaluation) and writes paper/table.md. The accuracy here is on the 400 validation sequences
split from the training set, not on the package's test set (gradexp does not read a test set
yet; README, "The paper's own models"). The paper's figures: Greydanus & Kobak, "Scaling down
deep learning with MNIST-1D" (ICML 2024), the table in the mnist1d README.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
MODEL, SHUFFLE = "model", "dataset.kwargs.shuffle"
PAPER = {("logistic", "false"): 32, ("mlp", "false"): 68, ("cnn", "false"): 94,
         ("gru", "false"): 91, ("logistic", "true"): 32, ("mlp", "true"): 68,
         ("cnn", "true"): 56, ("gru", "true"): 57}
MARGIN = 3  # points: the bar, the paper's accuracy ± 3


def table(summary: pd.DataFrame) -> pd.DataFrame:
    accuracy = summary[summary["metric"] == "val_accuracy"]
    rows = []
    for (model, shuffle), paper in PAPER.items():
        a = accuracy[(accuracy[MODEL] == f"paper_{model}") & (accuracy[SHUFFLE] == shuffle)]
        if a.empty:
            raise SystemExit(f"paper/summary.csv has no group model=paper_{model}, "
                             f"{SHUFFLE}={shuffle}")
        a = a.iloc[0]
        mean, low, high = (100 * float(a[k]) for k in ("mean", "ci_low", "ci_high"))
        rows.append({"model": model, "data": "shuffled" if shuffle == "true" else "regular",
                     "paper (test)": f"{paper}%",
                     "here (validation), mean [95% interval]":
                         f"{mean:.1f}% [{low:.1f}, {high:.1f}], n = {int(a['n'])}",
                     f"within {MARGIN} points": "yes" if abs(mean - paper) <= MARGIN
                                                else "**no**"})
    return pd.DataFrame(rows)


if __name__ == "__main__":
    summary = pd.read_csv(HERE / "paper" / "summary.csv", dtype={MODEL: str, SHUFFLE: str})
    summary[SHUFFLE] = summary[SHUFFLE].str.lower()
    result = table(summary).to_markdown(index=False)
    (HERE / "paper" / "table.md").write_text(result + "\n")
    print(result)
