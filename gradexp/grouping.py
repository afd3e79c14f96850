"""Which of a sweep's runs can share one compiled step (gradexp/batched.py), decided from their
configs alone, without TensorFlow: `hydra/launcher=gradexp` groups a sweep's jobs in the process
that composes them, before any of them trains.

    group_key(cfg)     equal for runs whose configs differ only in DATA_KEYS
    why_separate(cfg)  why runs of cfg cannot be batched (None: they can)
    Job                one run of a batch: config, directory, overrides, log file name
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


@dataclass(frozen=True)
class Job:
    """One run of a batch: its config, directory, overrides and log file name, and its
    provenance.json as the launcher wrote it when it set the run up (None: the run records its
    own when it starts)."""

    cfg: DictConfig
    run_dir: Path
    overrides: list
    log_name: str = "train.log"
    provenance: dict | None = None


def why_separate(cfg: DictConfig) -> str | None:
    """Why runs of `cfg` cannot be batched (None: they can), from the config alone."""
    if cfg.deterministic:
        return "deterministic=true: each run is its own program, bit for bit"
    if cfg.strategy != "none":
        return f"strategy={cfg.strategy}"
    if cfg.precision != "float32":
        return f"precision={cfg.precision}"
    if cfg.trainer.on_spike != "none":
        return f"trainer.on_spike={cfg.trainer.on_spike}"
    if cfg.model.name in NOT_BIT_EXACT:
        return f"model={cfg.model.name}: {NOT_BIT_EXACT[cfg.model.name]}"
    if not cfg.trainer.jit_compile and cfg.model.name in NOT_BIT_EXACT_WITHOUT_XLA:
        return (f"model={cfg.model.name} with trainer.jit_compile=false: "
                f"{NOT_BIT_EXACT_WITHOUT_XLA[cfg.model.name]}")
    return None


# Models whose step, looped over runs inside the compiled program, does not give the separate
# run's numbers bit for bit (measured: metrics.csv, checkpoints and histograms of 2-3 seeds x
# 60-100 steps against the separate runs'; mlp, rnn with each cell and transformer are equal,
# and without XLA mlp and rnn with each cell).
NOT_BIT_EXACT = {"cnn": "XLA compiles its convolutions inside the batch's loop to another order "
                        "of floating-point operations (losses apart from step 3)"}
NOT_BIT_EXACT_WITHOUT_XLA = {"transformer": "TensorFlow's kernels inside the batch's loop leave "
                                            "its numbers off its own run's in the last bits"}


# Keys whose values are data of the compiled step, not program: the seed (initial weights,
# data order), the clip layers' bounds (a weight of each layer: gradexp/layers.py) and the
# learning rate (a variable of the optimizer). Runs that differ only in these share one step.
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
