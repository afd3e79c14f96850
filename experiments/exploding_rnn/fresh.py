"""The test DECLARED.md names for the fresh seeds 5–14, as code, committed before their runs:
for each of the four settings that learned on seed 0 and on seeds 1–4 (the clip layer at ±0.1
after the RNN and inside the recurrence, clipping=global_norm, clipping=norm), the exact
one-sided McNemar test of "it learns on more seeds than the unclipped RNN": b = seeds it
learned and the unclipped RNN did not, c = the reverse, p = P(X ≥ b), X ~ Binomial(b + c, 1/2)
(scipy.stats.binomtest, alternative="greater"); the four p values adjusted by Holm's step-down
(statsmodels' multipletests), α = 0.05. Beside it, every setting's learned and diverged rates
with exact (Clopper–Pearson) 95% intervals.

    python experiments/exploding_rnn/fresh.py      (after fresh.sh; writes fresh/result.md)

Reads fresh/activation/runs.csv and fresh/params/runs.csv, as report.py reads the first sweeps'.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from report import UNCLIPPED, per_run
from scipy.stats import binomtest
from statsmodels.stats.multitest import multipletests
from table import rate

HERE = Path(__file__).resolve().parent
DECLARED = ("±0.1 after the RNN `[rnn_1]`", "±0.1 in the recurrence `[rnn_1_state]`",
            "`clipping=global_norm`", "`clipping=norm`")
ALPHA = 0.05


def tests(runs: pd.DataFrame) -> pd.DataFrame:
    """Per declared setting: b, c, the one-sided p and Holm's adjustment across the four."""
    base = runs[runs["setting"] == UNCLIPPED].set_index("seed")["learned"]
    rows = []
    for setting in DECLARED:
        mine = runs[runs["setting"] == setting].set_index("seed")["learned"]
        theirs = base.loc[mine.index]
        b, c = int((mine & ~theirs).sum()), int((~mine & theirs).sum())
        p = binomtest(b, b + c, 0.5, alternative="greater").pvalue if b + c else 1.0
        rows.append({"setting": setting, "seeds": len(mine),
                     "learned": rate(int(mine.sum()), len(mine)),
                     "unclipped learned": rate(int(theirs.sum()), len(theirs)),
                     "b (it alone)": b, "c (unclipped alone)": c, "one-sided p": p})
    table = pd.DataFrame(rows)
    table["Holm p"] = multipletests(table["one-sided p"], method="holm")[1]
    table["holds"] = table["Holm p"].map(lambda p: "yes" if p < ALPHA else "no")
    return table


def rates(runs: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame([{"setting": setting,
                          "learned": rate(int(g["learned"].sum()), len(g)),
                          "diverged": rate(int(g["diverged"].sum()), len(g))}
                         for setting, g in runs.groupby("setting", sort=False)])


def result(runs: pd.DataFrame) -> str:
    declared = tests(runs)
    seeds = sorted(runs["seed"].unique())
    held = int((declared["holds"] == "yes").sum())
    return "\n".join([
        f"Seeds {seeds[0]}–{seeds[-1]} ({len(seeds)} seeds). The declared hypotheses, each "
        f"setting against the unclipped RNN (exact one-sided McNemar, Holm-adjusted across the "
        f"four, α = {ALPHA}): {held} of {len(declared)} hold.", "",
        declared.to_markdown(index=False, floatfmt=".3g"), "",
        "Every setting on these seeds:", "", rates(runs).to_markdown(index=False), ""])


if __name__ == "__main__":
    text = result(per_run(HERE / "fresh"))
    (HERE / "fresh" / "result.md").write_text(text)
    print(text)
