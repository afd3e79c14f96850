"""The study's one table: every setting of both sweeps against the one unclipped group.

    python experiments/exploding_rnn/table.py <sweep dir>    (run.sh calls it)

Reads the runs.csv that `gradexp.summarize` wrote into activation/ and params/ (the per-run
metrics, defined in the README's "Summarizing a sweep") and each run directory under <sweep dir>
(gradexp.analysis.runs: its config, its summary.json for its wall time, and its metrics.csv for
the last evaluated error rate and the share of steps whose parameter gradients were clipped),
and <sweep dir>/wall_time.txt (run.sh's seconds for both sweeps and its worker processes). The
intervals and the sign test are gradexp.analysis.stats'. Writes table.md.

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


def mean_interval(values: pd.Series, unit: str = "") -> str:
    """mean ± 95% t half-width over the seeds that have a value; [n=k] when some have none.
    unit "%": the values are shares, shown in percent."""
    seeds, values = len(values), values.dropna().astype(float)
    scale = 100 if unit == "%" else 1
    if len(values) == 0:
        return "—"
    if len(values) == 1:
        return f"{scale * values.iloc[0]:.3g}{unit} [n=1]"
    half = float(t_half_width(values.std(ddof=1), len(values)))
    some = "" if len(values) == seeds else f" [n={len(values)}]"
    return f"{scale * values.mean():.3g}{unit} ± {scale * half:.2g}{unit}{some}"


def rate(k: int, n: int) -> str:
    """k/n and the exact (Clopper–Pearson) 95% interval."""
    low, high = map(float, clopper_pearson(k, n))
    return f"{k}/{n} [{low:.2f}, {high:.2f}]"


def median_range(values: pd.Series) -> str:
    """median (min–max) of the values there are; one value alone; — for none."""
    values = values.dropna()
    if len(values) < 2:
        return f"{values.iloc[0]:.0f}" if len(values) else "—"
    return f"{values.median():.0f} ({values.min():.0f}–{values.max():.0f})"


def paired(better: int, worse: int) -> str:
    """seeds better / worse than the unclipped run of the same seed, exact two-sided sign test
    (ties, both or neither, say nothing)."""
    return f"{better} / {worse}, {float(sign_test(better, worse)):.3g}"


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
            errors = m["error_rate/val"].iloc[:measured].dropna()
            succeeded = r["success"] == "1.0"
            rows.append({
                "setting": setting, "order": order, "part": part, "seed": int(r["seed"]),
                "run": r["run"], "diverged": diverged, "success": succeeded,
                "diverged_step": float(r["diverged_step"]) if diverged else np.nan,
                "success_step": float(r["steps_to_success"]) if succeeded else np.nan,
                "error_rate": np.nan if diverged or errors.empty else float(errors.iloc[-1]),
                "spikes_per_100": 100 * float(r["loss_spikes"]) / max(measured, 1),
                "val_loss": np.nan if diverged else float(r["val_loss"]),
                "elements_clipped": float(r["clip_fraction"]),
                "steps_clipped": m["param_clip/clipped"].iloc[:measured].mean(),
                "wall_time_s": float(run.summary["wall_time_s"]),
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
        n, unclipped = len(g), setting == "unclipped"
        p = base.loc[g.index]
        row = {"setting": setting, "order": g["order"].iloc[0],
               "learned": rate(int(g["success"].sum()), n),
               "vs unclipped: seeds gained / lost, p": "base" if unclipped else paired(
                   int((g["success"] & ~p["success"]).sum()),
                   int((~g["success"] & p["success"]).sum())),
               "learned by step": median_range(g["success_step"]),
               "val error rate (not diverged)": mean_interval(g["error_rate"], "%"),
               "val loss (not diverged)": mean_interval(g["val_loss"]),
               "diverged": rate(int(g["diverged"].sum()), n),
               "diverged at step": median_range(g["diverged_step"]),
               "vs unclipped: seeds saved / lost, p": "base" if unclipped else paired(
                   int((p["diverged"] & ~g["diverged"]).sum()),
                   int((~p["diverged"] & g["diverged"]).sum())),
               "spikes / 100 steps": mean_interval(g["spikes_per_100"])}
        activation = g["part"].iloc[0] == "activation"
        clipped = g["elements_clipped"].mean() if activation else g["steps_clipped"].mean()
        row["clipped"] = ("—" if unclipped else f"{100 * clipped:.1f}% of " +
                          ("dy elements" if activation else "steps"))
        rows.append(row)
    rows.sort(key=lambda row: row.pop("order"))  # unclipped, clip layer by place and bound, methods
    return pd.DataFrame(rows)


def wall_time(sweep: Path, runs: pd.DataFrame) -> str:
    """run.sh's seconds for both sweeps (if it wrote them) and the runs' own wall times."""
    times = runs["wall_time_s"]
    text = (f"A run's own wall time (`wall_time_s` of its summary.json, from the run's start in "
            f"its worker process to its end: data, model, compilation, training, evaluation): "
            f"median "
            f"{times.median():.0f} s, {times.min():.0f}–{times.max():.0f} s, "
            f"{times.sum():.0f} s for the {len(runs)} runs together.")
    marker = sweep / "wall_time.txt"
    if marker.exists():
        seconds, workers = marker.read_text().split()
        text = (f"Both sweeps, launch to last run: {int(seconds)} s ({int(seconds) / 60:.0f} min) "
                f"with hydra/launcher=gradexp, {workers} worker process(es) (the runs of a "
                f"setting train as one batch). " + text)
    return text


def main(sweep: Path) -> None:
    runs = per_run(sweep)
    copies = check_unclipped_runs_agree(runs)
    text = ["# exploding_rnn: every setting against the unclipped runs", "",
            f"Sweep: `{sweep}`. The unclipped row stands for {copies} identical copies per seed "
            "(clip=null at each placement, clipping=none): their losses agree step by step.", "",
            wall_time(sweep, runs), "",
            table(runs).to_markdown(index=False), "",
            "learned: runs that succeeded / runs (Pascanu et al.'s criterion: the run did not "
            "diverge and, at its last evaluation, under 1% of the 4096 held-out sequences have a "
            "squared error above 0.04), exact (Clopper–Pearson) 95% interval. seeds gained / "
            "lost: seeds where this setting learned and the unclipped run did not / the reverse; "
            "p: exact two-sided sign test on those seeds. learned by step: the first evaluation "
            "(every 200 steps) under 1%, median (range) over the runs that learned. val error "
            "rate: the share of held-out sequences above 0.04 at the last evaluation, mean ± 95% "
            "t half-width over the seeds that did not diverge (predicting the mean sum, 1, "
            "misclassifies 64%). val loss: the held-out mean squared error at the end, likewise "
            "(predicting the mean scores 1/6 ≈ 0.167). diverged: runs that diverged / runs, "
            "exact 95% interval; diverged at step: median (range); seeds saved / lost: seeds "
            "where the unclipped run diverged and this setting's did not / the reverse, two-sided "
            "sign test. spikes / 100 steps: `loss_spikes` over the steps before divergence, "
            "mean ± 95% t half-width over seeds. clipped: the clip layer's share of dy elements "
            "changed, or the share of steps whose parameter gradients the method changed.", ""]
    (HERE / "table.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
