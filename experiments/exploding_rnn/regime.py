"""The regime search's table: one row per probe run, from the run directories regime.sh made.

    python experiments/exploding_rnn/regime.py <probes dir>    (regime.sh calls it)

Reads every run directory under <probes dir> (gradexp.analysis.runs: its config, summary.json
and metrics.csv) and writes regime.md: the probe, what differs between its runs and the study
(sequence length, learning rate, recurrent gain, clipping, steps), and how the run ended. Runs
of one probe that are the same model and ended the same way (an unclipped layer at either
placement) are one row.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from gradexp.analysis.runs import load_runs

HERE = Path(__file__).resolve().parent


def setting(config: dict) -> str:
    """The run's clipping: the clip layer's bound and placement, and the parameter method."""
    layer = ("—" if config["clip"] is None else
             f"±{config['clip']} {','.join(config['layer']['positions'])}")
    name = config["clipping"]["name"]
    return layer if name == "none" else f"{layer}, clipping={name}" if layer != "—" else (
        f"clipping={name}")


def outcome(run) -> dict:
    """How the run ended: diverged at a step, or the error rate of its evaluations."""
    s, m = run.summary, run.metrics
    errors = m.dropna(subset=["error_rate/val"]) if "error_rate/val" in m else m.iloc[:0]
    under = errors[errors["error_rate/val"] < run.config["dataset"]["success_below"]]
    return {
        "ended": f"diverged at step {s['diverged_step']}" if s["diverged"] else "completed",
        "error rate, first → last evaluation": ("—" if errors.empty else
                                                f"{errors['error_rate/val'].iloc[0]:.3f} → "
                                                f"{errors['error_rate/val'].iloc[-1]:.3f}"),
        "lowest (at step)": ("—" if errors.empty else
                             f"{errors['error_rate/val'].min():.3f} "
                             f"({errors.loc[errors['error_rate/val'].idxmin(), 'step']:.0f})"),
        "first step under 1%": "—" if under.empty else f"{under['step'].iloc[0]:.0f}",
        "learned": "yes" if s.get("success") else "no",
        "val loss": "—" if s["val_loss"] is None else f"{s['val_loss']:.3f}"}


def rows(root: Path) -> pd.DataFrame:
    runs, skipped = load_runs(root)
    for name, reason in skipped:
        print(f"skipped {name}: {reason}", file=sys.stderr)
    out = []
    for run in runs:
        c = run.config
        out.append({"probe": Path(run.name).parts[0] if run.name != "." else root.name,
                    "T": c["dataset"]["length"], "lr": c["optimizer"]["learning_rate"],
                    "gain": c["model"]["recurrent_gain"], "unroll": c["model"]["unroll"],
                    "clipping": setting(c), "seed": c["seed"], "steps": c["trainer"]["steps"],
                    **outcome(run), "wall_time_s": run.summary["wall_time_s"]})
    table = pd.DataFrame(out)
    table["order"] = table["probe"].str[1:].astype(int)
    shown = [k for k in table.columns if k not in ("wall_time_s", "order")]
    table["runs"] = table.groupby(shown)["seed"].transform("size")
    return table.drop_duplicates(shown).sort_values(["order", "T", "lr", "gain", "clipping",
                                                     "unroll", "seed"], kind="stable")


def main(root: Path) -> None:
    runs, _ = load_runs(root)
    table = rows(root)
    seconds = sum(r.summary["wall_time_s"] for r in runs)
    text = ["# exploding_rnn: the regime search", "",
            f"Probes: `{root}` ({len(runs)} runs, {seconds / 60:.0f} min of the runs' own wall "
            "time). Every probe: simple RNN of 32 tanh units, recurrent kernel = gain × "
            "orthogonal, default SGD (momentum 0.9, summed loss, batch 64), the adding problem "
            "(le2015: y = v_i + v_j) with fresh sequences at every step and 4096 held-out ones. "
            "Error rate: the share of held-out sequences with a squared error above 0.04; "
            "learned: under 1% at the last evaluation and no divergence.", "",
            table.drop(columns=["wall_time_s", "order"]).to_markdown(index=False), "",
            "runs: how many runs the row stands for (the same model, ended the same way: the "
            "unclipped layer at either placement).", ""]
    (HERE / "regime.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
