"""gradexp's MNIST-1D test accuracies beside the paper's.

    python experiments/mnist1d/table.py      (run.sh calls it, after gradexp.summarize)

Reads the summary.csv that `gradexp.summarize` wrote into this folder (metric `val_accuracy`:
the accuracy on the package's 1,000 test sequences at the run's last evaluation; mean and 95%
t interval over the seeds) and writes table.md. The paper's figures: Greydanus & Kobak,
"Scaling down deep learning with MNIST-1D" (ICML 2024), the table in the mnist1d README.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
PRESET = "experiment"  # the grouping key of a `+experiment=a,b` sweep
PAPER = {"mnist1d": ("MLP", 68), "mnist1d_cnn": ("CNN", 94), "mnist1d_gru": ("GRU", 91)}
MARGIN = 3  # points: the bar, within 3 points of the paper's accuracy either way


def table(summary: pd.DataFrame) -> pd.DataFrame:
    accuracy = summary[summary["metric"] == "val_accuracy"].set_index(PRESET)
    rows = []
    for preset, (model, paper) in PAPER.items():
        a = accuracy.loc[preset]
        mean, low, high = (100 * float(a[k]) for k in ("mean", "ci_low", "ci_high"))
        rows.append({"model": model, "preset": f"`+experiment={preset}`",
                     "paper": f"{paper}%",
                     f"gradexp (mean, 95% interval, n = {int(a['n'])})":
                         f"{mean:.1f}% [{low:.1f}, {high:.1f}]",
                     f"within {MARGIN} points": "yes" if abs(mean - paper) <= MARGIN
                                                else "**no**"})
    return pd.DataFrame(rows)


if __name__ == "__main__":
    result = table(pd.read_csv(HERE / "summary.csv", dtype={PRESET: str}))
    (HERE / "table.md").write_text(result.to_markdown(index=False) + "\n")
    print(result.to_markdown(index=False))
