"""What the paper's own code gave, as its repository records it: the test accuracies printed in
the outputs of the two notebooks that ran its benchmark (greydanus/mnist1d, PyTorch, its
notebooks/train.py loop: Adam at 1e-2, batches of 100, seed 42, one run per model and data,
6,000 steps, the test accuracy printed every 1,000 steps), into paper/notebooks.csv.

    quickstart.ipynb                          the first commit, 2020-11-28, the day the README's
                                              table was written: the regular data only
    notebooks/mnist1d-classification.ipynb    2024-05-16, the notebook of the benchmark figure:
                                              the regular and the shuffled data

Both ran on the sequences this study trains on: their mnist1d_data.pkl equals `make_dataset` of
the package's published arguments (paper_data.generated) to 9e-16, labels equal.

    git clone https://github.com/greydanus/mnist1d /tmp/mnist1d
    python experiments/mnist1d/paper_notebook.py /tmp/mnist1d

One row per printed step: commit, date, notebook, model, data, step, test_accuracy (percent, as
printed).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
NOTEBOOKS = [("08ff47fc74375c6aca30416a2080ea5695f9b751", "2020-11-28", "quickstart.ipynb"),
             ("d53784556b473b75cbf5d5729ad9a313b29cea68", "2024-05-16",
              "notebooks/mnist1d-classification.ipynb")]
MODELS = {"LinearBase": "logistic", "MLPBase": "mlp", "ConvBase": "cnn", "GRUBase": "gru"}
STEP = re.compile(r"^step (\d+),.*test_acc ([\d.]+)\s*$")


def printed(notebook: dict) -> list[dict]:
    """The test accuracies a notebook's training cells printed: a cell that trains on
    `data_shuff` is the shuffled data. Each model's lines follow its "Initialized <Name> model"
    line."""
    rows = []
    for cell in notebook["cells"]:
        source = "".join(cell.get("source", []))
        data = "shuffled" if "data_shuff" in source else "regular"
        text = "".join("".join(o.get("text", [])) for o in cell.get("outputs", []))
        for block in text.split("Initialized ")[1:]:
            model = MODELS[block.split()[0]]
            for line in block.splitlines():
                if m := STEP.match(line):
                    rows.append({"model": model, "data": data, "step": int(m[1]),
                                 "test_accuracy": float(m[2])})
    return rows


def read(clone: Path) -> pd.DataFrame:
    rows = []
    for commit, date, path in NOTEBOOKS:
        text = subprocess.run(["git", "-C", str(clone), "show", f"{commit}:{path}"],
                              capture_output=True, text=True, check=True).stdout
        rows += [{"commit": commit[:7], "date": date, "notebook": path, **row}
                 for row in printed(json.loads(text))]
    return pd.DataFrame(rows)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: paper_notebook.py CLONE_OF_GREYDANUS_MNIST1D")
    found = read(Path(sys.argv[1]))
    found.to_csv(HERE / "paper" / "notebooks.csv", index=False)
    print(found.groupby(["date", "data", "model"]).last().to_string())
