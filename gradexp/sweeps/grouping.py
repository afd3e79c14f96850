"""Which of a sweep's runs can share one compiled step (gradexp/training/engine.py), decided from
their configs alone, without TensorFlow: `hydra/launcher=gradexp` groups a sweep's jobs in the
process that composes them, before any of them trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


@dataclass(frozen=True)
class Job:
    """One run: its config, directory and overrides; under hydra/launcher=gradexp its log file
    (name and format, as its job's Hydra logging has them) and its provenance.json as the
    launcher wrote it when it set the run up (None: the run records its own when it starts)."""

    cfg: DictConfig
    run_dir: Path
    overrides: list
    log_name: str = "train.log"
    provenance: dict | None = None
    log_format: str = "[%(asctime)s] %(message)s"  # its job_logging's file handler's


def why_separate(cfg: DictConfig) -> str | None:
    """Why runs of `cfg` cannot be batched (None: they can), from the config alone."""
    if cfg.deterministic:
        return "deterministic=true: each run is its own program, bit for bit"
    if cfg.strategy != "none":
        return f"strategy={cfg.strategy}: a run of its own on every replica"
    return None


# Keys whose values are data of the compiled step, not program: the seed (initial weights, data
# order), the clip layers' bounds (a weight of each layer) and the learning rate (a variable).
DATA_KEYS = ("seed", "clip", "layer.clip_min", "layer.clip_max", "optimizer.learning_rate")


def group_key(cfg: DictConfig) -> str:
    """Runs with equal keys share one compiled step: their configs differ only in DATA_KEYS."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    for key in DATA_KEYS:
        *path, last = key.split(".")
        node = plain
        for part in path:
            node = node[part]
        node.pop(last, None)
    return repr(sorted(plain.items(), key=lambda kv: kv[0]))
