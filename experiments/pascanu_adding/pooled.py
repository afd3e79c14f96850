"""Both seed ranges of the study in one table: seeds 0–9 (runs.csv, the preset's) and 10–19
(unseen/runs.csv), each run once, pooled by seed.

    python experiments/pascanu_adding/pooled.py      (after both summaries; writes pooled.md)

Per setting and seed range: successes / seeds with the exact (Clopper–Pearson) 95% interval,
divergences likewise; per range, SGD-C against plain SGD paired by seed: seeds gained and lost,
two-sided exact sign test (gradexp.analysis.stats, as `gradexp.summarize` computes them).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from gradexp.analysis.stats import clopper_pearson, sign_test

HERE = Path(__file__).resolve().parent
KEY = "clipping.max_norm"
RANGES = {"0–9 (the regime was chosen on 0–4)": HERE / "runs.csv",
          "10–19 (unseen)": HERE / "unseen" / "runs.csv"}


def rate(flags: pd.Series) -> str:
    k, n = int(flags.sum()), len(flags)
    low, high = clopper_pearson(k, n)
    return f"{k}/{n} [{low:.2f}, {high:.2f}]"


def rows(name: str, runs: pd.DataFrame) -> list[dict]:
    runs = runs.assign(setting=runs[KEY].map(lambda v: "SGD-C" if v == v else "SGD"))
    by_seed = runs.pivot(index="seed", columns="setting", values="success")
    gained = int(((by_seed["SGD-C"] == 1) & (by_seed["SGD"] == 0)).sum())
    lost = int(((by_seed["SGD-C"] == 0) & (by_seed["SGD"] == 1)).sum())
    out = []
    for setting in ("SGD", "SGD-C"):
        mine = runs[runs["setting"] == setting]
        out.append({"seeds": name, "setting": setting, "success": rate(mine["success"]),
                    "diverged": rate(mine["diverged"].astype(float)),
                    "SGD-C vs SGD: gained / lost, sign p":
                        f"{gained} / {lost}, p = {float(sign_test(gained, lost)):.3g}"
                        if setting == "SGD-C" else "base"})
    return out


if __name__ == "__main__":
    parts = {name: pd.read_csv(path) for name, path in RANGES.items()}
    parts["0–19 (both)"] = pd.concat(parts.values(), ignore_index=True)
    table = pd.DataFrame([row for name, runs in parts.items() for row in rows(name, runs)])
    (HERE / "pooled.md").write_text(table.to_markdown(index=False) + "\n")
    print(table.to_markdown(index=False))
