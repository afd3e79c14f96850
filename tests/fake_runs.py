"""Run directories written by hand, as gradexp.train leaves them (.hydra/, metrics.csv,
summary.json), for the analysis tests: small runs whose metrics can be worked out by hand."""

from __future__ import annotations

import json

import yaml

# A run of 10 steps whose metrics are worked out by hand in test_metrics_of_one_run.
LOSSES = [4, 3, 2, 8, 2, 1.5, 1, 0.5, 2.5, 0.6]
NORMS = [2, 4, 4, 4, 5, 5, 7, 9, 5, 5]
FRACTIONS = {"dense_1": [0.1] * 10, "dense_2": [0.0] * 5 + [0.5] * 5}
VAL = {5: (2.0, 0.5), 10: (1.0, 0.75)}  # step: (loss/val, accuracy/val)


def _field(value) -> str:
    return "" if value is None else str(value)  # str(nan) is "nan", as the trainer writes it


def write_run(run_dir, overrides, losses, *, norms=None, fractions=None, val=None,
              status="completed", summary=None, config=None, columns=None, provenance=None):
    """A run directory as gradexp.train leaves it: .hydra/, metrics.csv, summary.json;
    `columns`: more per-step columns, {name: values}; `provenance`: provenance.json's
    contents (none is written without it, as by a run older than provenance)."""
    cfg = {"clip": None, "seed": 0, "model": {"name": "mlp", "width": 16},
           "clipping": {"name": "none"}, "layer": {"scale": 1.0},
           "trainer": {"steps": len(losses), "divergence_factor": 1000.0}}
    for override in overrides:  # as Hydra composes them (enough for these tests)
        key, _, value = override.lstrip("+").partition("=")
        if key == "experiment":  # a preset (`# @package _global_`) is no node of the config
            continue
        node, *path = [cfg, *key.split(".")]
        for part in path[:-1]:
            node = node.setdefault(part, {})
        if isinstance(node.get(path[-1]), dict):  # a config group: model=mlp picks a node
            node[path[-1]]["name"] = value
        else:
            node[path[-1]] = yaml.safe_load(value)
    for key, value in (config or {}).items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    n = len(losses)
    norms = norms if norms is not None else [1.0] * n
    fractions = fractions or {"dense_1": [0.0] * n}
    val = val or {}
    columns = columns or {}
    header = ["step", "loss/train", "grad_norm/global", "learning_rate", *columns]
    for p in fractions:
        header += [f"grad_norm/{p}/pre", f"grad_norm/{p}/post", f"clip_fraction/{p}"]
    lines = [",".join([*header, "loss/val", "accuracy/val"])]
    for i in range(n):
        row = [i + 1, float(losses[i]), float(norms[i]), 0.001, *(c[i] for c in columns.values())]
        for f in fractions.values():
            row += [1.0, 1.0 - f[i], f[i]]
        row += list(val.get(i + 1, (None, None)))
        lines.append(",".join(map(_field, row)))
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({
        "status": status, "diverged": status == "diverged", "diverged_step": None, "steps": n,
        "config": cfg, "overrides": list(overrides), **(summary or {})}))
    if provenance is not None:
        (run_dir / "provenance.json").write_text(json.dumps(provenance))
    return run_dir


def code_record(commit, dirty=False, diff=None, resumes=()):
    """provenance.json reduced to what the summary reads: the code's commit and state."""
    def entry(commit, dirty, diff):
        return {"code": {"commit": commit, "dirty": dirty,
                         "diff": "provenance.diff" if dirty else None, "diff_sha256": diff}}

    return {**entry(commit, dirty, diff), "resumes": [entry(*r) for r in resumes]}


def ending_at(final: float, n: int = 10) -> list[float]:
    """A loss curve of n steps from 4 down to `final` (final_loss = final with the defaults)."""
    return [4.0] * (n - 1) + [final]


def two_sweeps(root, clip_runs=None, method_runs=None):
    """A clip sweep (clip=null,0.1, preset a) and a clipping-method sweep (clipping=none,agc,
    preset b) of one model, 2 seeds each, in one folder; final losses per seed."""
    finals = {("null", "none"): [2.0, 3.0], ("0.1", "none"): [1.0, 1.0],
              ("null", "agc"): [2.5, 2.0]}
    for seed in range(2):
        for clip in ("null", "0.1"):
            write_run(root / f"a/{clip}_{seed}", [f"clip={clip}", f"seed={seed}",
                                                  "+experiment=a"],
                      ending_at(finals[(clip, "none")][seed]), **(clip_runs or {}))
        for method in ("none", "agc"):
            write_run(root / f"b/{method}_{seed}", [f"clipping={method}", f"seed={seed}",
                                                    "+experiment=b"],
                      ending_at(finals[("null", method)][seed]), **(method_runs or {}))
