"""gradexp from Python (a notebook, a script): compose a config, train it, read runs back.

    import gradexp.api as gx

    cfg = gx.compose("clip=0.1", "trainer.steps=200")   # the CLI's config, checked
    summary = gx.run("runs/clip-0.1", "clip=0.1", "trainer.steps=200")  # a CLI run's directory
    gx.run("runs/unclipped", "trainer.steps=200")
    table = gx.load_runs("runs")                         # one row per run
    print(table[["run", "clip", "status", "final_loss"]])

`python -m gradexp.summarize runs` then compares them as it compares a sweep's runs.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pandas as pd  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from gradexp import config
from gradexp.runs import rundir  # noqa: E402

SUMMARY_COLUMNS = ("status", "steps", "final_loss", "val_loss", "val_accuracy", "diverged",
                   "diverged_step", "steps_per_s")


def compose(*overrides: str, config_dir: str | Path | None = None) -> DictConfig:
    """The config `python -m gradexp.train *overrides` runs (`config_dir`: a directory of one's
    own config options, as `--config-dir`), validated: a bad value raises ConfigError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config.check_overrides(list(overrides))
    extra = ([f"hydra.searchpath=[file://{Path(config_dir).resolve()}]"] if config_dir else [])
    GlobalHydra.instance().clear()
    from gradexp.train import CONF_DIR  # the entry point's config directory, spelled there

    try:
        with initialize_config_dir(CONF_DIR, version_base="1.3"):
            cfg = hydra_compose("config", overrides=[*overrides, *extra])
    except Exception as exc:
        message = config.explain(exc)
        if message is None:
            raise
        raise config.ConfigError(message) from None
    finally:
        GlobalHydra.instance().clear()
    config.validate(cfg)
    return OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])


def run(run_dir: str | Path, *overrides: str, config_dir: str | Path | None = None) -> dict:
    """Train `compose(*overrides)` into `run_dir`, a new directory; return its summary.json.
    The directory holds what a CLI run's does (`.hydra/` with the config and overrides,
    metrics.csv, TensorBoard events, checkpoints, summary.json): summarize reads it alike."""
    from gradexp.train import train

    cfg = compose(*overrides, config_dir=config_dir)
    run_dir = Path(run_dir)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise config.ConfigError(f"run_dir={run_dir}: not empty; give each run a new directory")
    (run_dir / rundir.HYDRA).mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / rundir.CONFIG)
    OmegaConf.save(OmegaConf.create(list(overrides)), run_dir / rundir.OVERRIDES)
    return train(cfg, run_dir, list(overrides))


def load_runs(root: str | Path) -> pd.DataFrame:
    """Every run under `root`: one row per run, its name (path under root), its overrides as
    columns (`clip`, `seed`, ...), and its summary's figures (SUMMARY_COLUMNS)."""
    from gradexp.analysis.runs import load_runs as read_all

    runs, _ = read_all(root)
    return pd.DataFrame([{"run": r.name, **r.overrides,
                          **{k: r.summary.get(k) for k in SUMMARY_COLUMNS}} for r in runs])
