"""The test DECLARED.md named before its runs: on seeds 20–39 of the chosen regime, the exact
one-sided McNemar test of "SGD-C succeeds on more seeds than plain SGD": b = seeds SGD-C
solved and SGD did not, c = the reverse, p = P(X ≥ b), X ~ Binomial(b + c, 1/2)
(scipy.stats.binomtest, alternative="greater"), α = 0.05; beside it each method's success and
divergence rates with exact (Clopper–Pearson) 95% intervals.

    python experiments/pascanu_adding/mcnemar.py experiments/pascanu_adding/test/runs.csv

Writes result.md beside the runs.csv it reads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from scipy.stats import binomtest

from gradexp.analysis.stats import clopper_pearson

METHOD = "clipping.max_norm"


def pairs(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(plain SGD, SGD-C): each method's runs indexed by seed, the seeds both have."""
    plain = runs[METHOD].isna() | (runs[METHOD].astype(str) == "null")  # pandas: null -> NaN
    sgd = runs[plain].set_index("seed").sort_index()
    sgd_c = runs[~plain].set_index("seed").sort_index()
    seeds = sgd.index.intersection(sgd_c.index)
    return sgd.loc[seeds], sgd_c.loc[seeds]


def rate(column: str, table: pd.DataFrame) -> str:
    """k/n and the exact (Clopper–Pearson) 95% interval."""
    k, n = int(table[column].sum()), len(table)
    low, high = clopper_pearson(k, n)
    return f"{k}/{n} [{float(low):.2f}, {float(high):.2f}]"


def result(runs: pd.DataFrame) -> str:
    """The declared test's result, as result.md states it."""
    sgd, sgd_c = pairs(runs)
    seeds = sgd.index
    b = int(((sgd_c["success"] == 1) & (sgd["success"] == 0)).sum())
    c = int(((sgd_c["success"] == 0) & (sgd["success"] == 1)).sum())
    p = binomtest(b, b + c, 0.5, alternative="greater").pvalue if b + c else 1.0
    verdict = "holds" if p < 0.05 else "does not hold"
    return (f"Seeds {seeds.min()}–{seeds.max()} ({len(seeds)} pairs). Success: SGD-C "
            f"{rate('success', sgd_c)}, plain SGD {rate('success', sgd)}; diverged: SGD-C "
            f"{rate('diverged', sgd_c)}, plain SGD {rate('diverged', sgd)}. Discordant seeds: "
            f"{b} solved by SGD-C alone, {c} by plain SGD alone; exact one-sided McNemar "
            f"p = {p:.4g}: the declared hypothesis {verdict} at α = 0.05.\n")


def main(path: str) -> None:
    text = result(pd.read_csv(path))
    (Path(path).parent / "result.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1])
