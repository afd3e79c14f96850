"""The MNIST-1D paper's table beside this study's: the four models on the regular and the
spatially shuffled data, the paper's test accuracy and this study's test accuracy (the final
weights on the package's 1,000 test sequences, read once after the last step), mean and 95%
interval over seeds 0–4, within 3 points of the paper or not; what the paper's own code gave in
the runs its repository records (paper/notebooks.csv, paper_notebook.py: the final test
accuracy, one run each, 6,000 steps), and this study within 3 points of that or not; the
validation accuracy (400 sequences split from the training set, at the last evaluation) beside
it.

    python experiments/mnist1d/paper_table.py      (paper_run.sh calls it)

Reads paper/summary.csv (gradexp.summarize: metrics `test_accuracy` and `val_accuracy`) and
paper/notebooks.csv, and writes paper/table.md. The paper's figures: Greydanus & Kobak,
"Scaling down deep learning with MNIST-1D" (ICML 2024), the table in the mnist1d README.
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
LATEST = "2024-05-16"  # the paper code's run on both data (notebooks.csv's dates)
RUNS = {"2020-11-28": "its code, 2020 run", LATEST: "its code, 2024 run"}


def data_name(shuffle: str) -> str:
    return "shuffled" if shuffle == "true" else "regular"


def cell(rows: pd.DataFrame, metric: str) -> tuple[float, float, float, int]:
    """(mean, 95% low, 95% high) in percent and n seeds of a group's `metric`."""
    row = rows[rows["metric"] == metric].iloc[0]
    return (*(100 * float(row[k]) for k in ("mean", "ci_low", "ci_high")), int(row["n"]))


def group(summary: pd.DataFrame, model: str, shuffle: str) -> pd.DataFrame:
    """The summary's rows of one cell, which must have a test accuracy."""
    rows = summary[(summary[MODEL] == f"paper_{model}") & (summary[SHUFFLE] == shuffle)]
    if not rows["metric"].eq("test_accuracy").any():
        raise SystemExit(f"paper/summary.csv has no test_accuracy of model=paper_{model}, "
                         f"{SHUFFLE}={shuffle} (runs without trainer.test?)")
    return rows


def gaps(summary: pd.DataFrame) -> list[float]:
    """Per cell, in PAPER's order: the mean test accuracy minus the paper's, in points."""
    return [cell(group(summary, model, shuffle), "test_accuracy")[0] - paper
            for (model, shuffle), paper in PAPER.items()]


def code_runs(notebooks: pd.DataFrame) -> dict[tuple[str, str, str], float]:
    """{(date, model, data): the final printed test accuracy} of the paper code's runs."""
    final = notebooks.sort_values("step").groupby(["date", "model", "data"]).last()
    return final["test_accuracy"].to_dict()


def code_gaps(summary: pd.DataFrame, notebooks: pd.DataFrame) -> list[float]:
    """Per cell, in PAPER's order: the mean test accuracy minus the paper code's LATEST run's."""
    code = code_runs(notebooks)
    return [cell(group(summary, model, shuffle), "test_accuracy")[0]
            - code[LATEST, model, data_name(shuffle)] for model, shuffle in PAPER]


def code_to_paper(notebooks: pd.DataFrame) -> list[float]:
    """Per cell, in PAPER's order: the paper code's LATEST run minus the paper's figure."""
    code = code_runs(notebooks)
    return [code[LATEST, model, data_name(shuffle)] - paper
            for (model, shuffle), paper in PAPER.items()]


def within(gap: float) -> str:
    return "yes" if abs(gap) <= MARGIN else "**no**"


def table(summary: pd.DataFrame, notebooks: pd.DataFrame) -> pd.DataFrame:
    code = code_runs(notebooks)
    rows = []
    for ((model, shuffle), paper), to_code in zip(PAPER.items(), code_gaps(summary, notebooks),
                                                  strict=True):
        data = data_name(shuffle)
        rows_of_cell = group(summary, model, shuffle)
        mean, low, high, n = cell(rows_of_cell, "test_accuracy")
        val = cell(rows_of_cell, "val_accuracy")
        rows.append({"model": model, "data": data, "paper (test)": f"{paper}%",
                     **{name: f"{code[date, model, data]:.1f}%" if (date, model, data) in code
                        else "not run" for date, name in RUNS.items()},
                     "here (test), mean [95% interval]":
                         f"{mean:.1f}% [{low:.1f}, {high:.1f}], n = {n}",
                     f"within {MARGIN} points of the paper": within(mean - paper),
                     "of its code's 2024 run": within(to_code),
                     "here (validation)": f"{val[0]:.1f}% [{val[1]:.1f}, {val[2]:.1f}]"})
    return pd.DataFrame(rows)


def read() -> tuple[pd.DataFrame, pd.DataFrame]:
    """paper/summary.csv (its shuffle column as lower-case text) and paper/notebooks.csv."""
    summary = pd.read_csv(HERE / "paper" / "summary.csv", dtype={MODEL: str, SHUFFLE: str})
    summary[SHUFFLE] = summary[SHUFFLE].str.lower()
    return summary, pd.read_csv(HERE / "paper" / "notebooks.csv")


if __name__ == "__main__":
    result = table(*read()).to_markdown(index=False)
    (HERE / "paper" / "table.md").write_text(result + "\n")
    print(result)
