"""The study's one table: every setting of both sweeps against the one unclipped group.

    python experiments/exploding_rnn/table.py <sweep dir>    (run.sh calls it)

Reads the runs.csv that `gradexp.summarize` wrote into activation/ and params/ (the per-run
metrics, defined in the README's "Summarizing a sweep") and each run directory under <sweep dir>
(gradexp.analysis.runs: its config, and its metrics.csv for the share of steps whose parameter
gradients were clipped). The intervals and the sign test are gradexp.analysis.stats'. Writes
table.md.

summarize compares along one baseline key, so each of its two reports has its own unclipped
group (clip=null per placement; clipping=none). They are the same model: an unclipped clip layer
is the identity and has no weights. This script checks that their losses are identical, step by
step, seed by seed, then shows them as one row.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from gradexp.analysis.runs import Run, read_run
from gradexp.analysis.stats import clopper_pearson, sign_test, t_half_width

HERE = Path(__file__).resolve().parent
PLACES = {"[rnn_1]": "after the RNN `[rnn_1]`",
          "[rnn_1_state]": "in the recurrence `[rnn_1_state]`"}


def read_runs(part: str) -> pd.DataFrame:
    return pd.read_csv(HERE / part / "runs.csv", dtype=str, keep_default_na=False, na_values=[""])


def mean_interval(values: pd.Series) -> str:
    """mean ± 95% t half-width over the seeds that have a value; [n=k] when some have none."""
    seeds, values = len(values), values.dropna().astype(float)
    if len(values) == 0:
        return "—"
    if len(values) == 1:
        return f"{values.iloc[0]:.3g} [n=1]"
    half = float(t_half_width(values.std(ddof=1), len(values)))
    some = "" if len(values) == seeds else f" [n={len(values)}]"
    return f"{values.mean():.3g} ± {half:.2g}{some}"


def method(run: Run) -> str:
    """`clipping=<name>` and its bound, from the run's composed config."""
    c = run.config["clipping"]
    bound = {"global_norm": f"‖g‖ ≤ {c.get('max_norm')}",
             "norm": f"each tensor's ‖g_i‖ ≤ {c.get('max_norm')}",
             "value": f"each element to ±{c.get('max_value')}", "agc": f"λ = {c.get('factor')}",
             "autoclip": f"percentile {c.get('percentile')}",
             "zclip": f"z > {c.get('z_threshold')}, warm-up {c.get('warmup_steps')} steps"}
    return f"`clipping={c['name']}` ({bound[c['name']]})" if c["name"] in bound else "unclipped"


def per_run(sweep: Path) -> pd.DataFrame:
    """One row per run of both sweeps: setting, seed, and the measures of the table."""
    rows = []
    for part in ("activation", "params"):
        for _, r in read_runs(part).iterrows():
            run = read_run(sweep / part / r["run"], r["run"])
            m = run.metrics
            diverged = r["diverged"] == "1.0"
            measured = int(float(r["diverged_step"])) - 1 if diverged else len(m)
            if part == "activation":
                unclipped = r["clip"] == "null"
                place = PLACES[r["layer.positions"]]
                setting = "unclipped" if unclipped else f"±{r['clip']} {place}"
                order = (1, r["layer.positions"], 0.0 if unclipped else float(r["clip"]), "")
            else:
                setting, order = method(run), (2, "", 0.0, r["clipping"])
                unclipped = r["clipping"] == "none"
            order = (0, "", 0.0, "") if unclipped else order
            rows.append({
                "setting": setting, "order": order, "part": part, "seed": int(r["seed"]),
                "run": r["run"], "diverged": diverged,
                "diverged_step": float(r["diverged_step"]) if diverged else np.nan,
                "spikes_per_100": 100 * float(r["loss_spikes"]) / max(measured, 1),
                "final_loss": np.nan if diverged else float(r["final_loss"]),
                "val_loss": np.nan if diverged else float(r["val_loss"]),
                "elements_clipped": float(r["clip_fraction"]),
                "steps_clipped": m["param_clip/clipped"].iloc[:measured].mean(),
                "loss": m["loss/train"].to_numpy()})
    return pd.DataFrame(rows)


def check_unclipped_runs_agree(runs: pd.DataFrame) -> int:
    """The unclipped runs of the three reports, seed by seed: identical loss curves."""
    base = runs[runs["setting"] == "unclipped"]
    for seed, same in base.groupby("seed"):
        first = same["loss"].iloc[0]
        if not all(np.array_equal(first, other) for other in same["loss"]):
            raise SystemExit(f"unclipped runs of seed {seed} differ: {list(same['run'])}")
    return len(base) // base["seed"].nunique()


def table(runs: pd.DataFrame) -> pd.DataFrame:
    base = (runs[runs["setting"] == "unclipped"].drop_duplicates("seed")
            .set_index("seed"))
    rows = []
    for setting, g in runs.groupby("setting", sort=False):
        g = g.drop_duplicates("seed").set_index("seed").sort_index()
        k, n = int(g["diverged"].sum()), len(g)
        low, high = map(float, clopper_pearson(k, n))
        steps = g["diverged_step"].dropna()
        row = {"setting": setting, "order": g["order"].iloc[0],
               "diverged": f"{k}/{n} [{low:.2f}, {high:.2f}]",
               "diverged at step": (f"{steps.median():.0f} ({steps.min():.0f}–{steps.max():.0f})"
                                    if len(steps) else "—"),
               "spikes / 100 steps": mean_interval(g["spikes_per_100"]),
               "final loss (not diverged)": mean_interval(g["final_loss"]),
               "val loss (not diverged)": mean_interval(g["val_loss"])}
        if setting != "unclipped":
            paired = base.loc[g.index]
            fewer = int((g["spikes_per_100"] < paired["spikes_per_100"]).sum())
            more = int((g["spikes_per_100"] > paired["spikes_per_100"]).sum())
            p_spikes = float(sign_test(fewer, more, alternative="greater"))
            # exact one-sided sign test: seeds where unclipped diverged and this did not, vs
            # the reverse (ties, both or neither diverged, say nothing)
            better = int((paired["diverged"] & ~g["diverged"]).sum())
            worse = int((~paired["diverged"] & g["diverged"]).sum())
            p = float(sign_test(better, worse, alternative="greater"))
            row["vs unclipped: seeds saved / lost, p"] = f"{better} / {worse}, {p:.3g}"
            row["vs unclipped: fewer spikes / 100"] = f"{fewer}/{n}, {p_spikes:.3g}"
        else:
            row["vs unclipped: seeds saved / lost, p"] = "base"
            row["vs unclipped: fewer spikes / 100"] = "base"
        clipped = (g["elements_clipped"].mean() if g["part"].iloc[0] == "activation"
                   else g["steps_clipped"].mean())
        row["clipped"] = ("—" if setting == "unclipped" else
                          f"{100 * clipped:.1f}% of " +
                          ("dy elements" if g["part"].iloc[0] == "activation" else "steps"))
        rows.append(row)
    rows.sort(key=lambda row: row.pop("order"))  # unclipped, clip layer by place and bound, methods
    return pd.DataFrame(rows)


def main(sweep: Path) -> None:
    runs = per_run(sweep)
    copies = check_unclipped_runs_agree(runs)
    text = ["# exploding_rnn: every setting against the unclipped runs", "",
            f"Sweep: `{sweep}`. The unclipped row stands for {copies} identical copies per seed "
            "(clip=null at each placement, clipping=none): their losses agree step by step.", "",
            table(runs).to_markdown(index=False), "",
            "diverged: runs that diverged / runs, exact (Clopper–Pearson) 95% interval. "
            "diverged at step: median (range). spikes / 100 steps: `loss_spikes` over the steps "
            "before divergence, mean ± 95% t half-width over seeds. final and val loss: mean ± "
            "95% t half-width over the seeds that did not diverge (predicting the mean scores "
            "1/6 ≈ 0.167). seeds saved / lost: seeds where the unclipped run diverged and this "
            "setting's did not / the reverse; p: exact one-sided sign test on those seeds. "
            "fewer spikes: seeds whose spike rate is below the unclipped run's of the same "
            "seed, and the one-sided sign test (ties left out). clipped: the clip layer's share "
            "of dy elements changed, or the share of steps whose parameter gradients the method "
            "changed.", ""]
    (HERE / "table.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
