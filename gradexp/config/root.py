"""The composed config as a whole: its root schema `Config` and `validate`, which checks a
composed config's values, choices and combinations (Hydra has checked keys and types).

The groups' options live in their own modules (model, dataset, optimizer, clipping; layer and
trainer are plain nodes); gradexp/config/hydra_glue.py puts all of it in Hydra's ConfigStore.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from gradexp.config.base import ConfigError, finite, need, one_of, schema_keys, show
from gradexp.config.layer import LayerConfig, clip_bounds, positions
from gradexp.config.model import check_model_takes
from gradexp.config.trainer import TrainerConfig

DEVICES = ("auto", "cpu", "gpu")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("none", "mirrored")
CHECKED = ("model", "dataset", "optimizer", "clipping", "layer", "trainer")  # nodes with a `check`
TEST_SPLITS = ("datasets with one: mnist1d with dataset.val_fraction set, tfds with "
               "dataset.split_test, arrays whose load returns a third part (x_test, y_test)")


@dataclass
class Config:
    model: Any = MISSING
    dataset: Any = MISSING
    optimizer: Any = MISSING
    clipping: Any = MISSING
    layer: LayerConfig = field(default_factory=LayerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    clip: float | None = None  # ±clip on the backward pass of every clip layer; null: unclipped
    seed: int = 0  # initialisation and data order (the data themselves: dataset.seed)
    device: str = "auto"  # auto | cpu | gpu
    precision: str = "float32"  # float32 | mixed_float16 (with loss scaling) | mixed_bfloat16
    strategy: str = "none"  # none | mirrored (tf.distribute.MirroredStrategy, all devices)
    deterministic: bool = False  # TensorFlow op determinism: same config and seed, same numbers
    resume: str | None = None  # a run directory: continue that run from its latest checkpoint


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError (one line naming the key) for the first bad value in `cfg`."""
    _unknown_keys(cfg)
    need(cfg.clip is None or (finite(cfg.clip) and cfg.clip > 0), "clip", cfg.clip,
         "must be a positive number or null (null: no clipping)")
    # keras.utils.set_random_seed passes it to NumPy, which takes [0, 2**32 - 1] only
    need(0 <= cfg.seed <= 2**32 - 1, "seed", cfg.seed, "must be an integer in [0, 2**32 - 1]")
    if "seed" in cfg.dataset:  # dataset=arrays and tfds have none
        need(0 <= cfg.dataset.seed <= 2**32 - 1, "dataset.seed", cfg.dataset.seed,
             "must be an integer in [0, 2**32 - 1]")
    one_of("device", cfg.device, DEVICES)
    one_of("precision", cfg.precision, PRECISIONS)
    one_of("strategy", cfg.strategy, STRATEGIES)
    if cfg.strategy == "mirrored" and cfg.trainer.on_divergence == "continue":
        raise ConfigError("trainer.on_divergence=continue, strategy=mirrored: skipping "
                          "non-finite updates works on one device only; use one of them")
    for group in CHECKED:
        _no_missing(cfg[group], group)
        try:
            OmegaConf.to_object(cfg[group]).check()
        except ConfigError as exc:
            raise ConfigError(f"{group}.{exc}") from None
    dataset = OmegaConf.to_object(cfg.dataset)
    if cfg.trainer.test and dataset.has_test_split() is False:
        raise ConfigError(f"trainer.test=true: dataset={type(dataset).name} has no test split; "
                          f"{TEST_SPLITS}")
    if dataset.input_shape() is not None:  # else known once loaded: make_step checks it then
        check_model_takes(OmegaConf.to_object(cfg.model), dataset.name, dataset.input_shape())
    low, high = clip_bounds(cfg)
    if low is not None and high is not None and low > high:
        raise ConfigError(f"layer.clip_min={show(low)}, layer.clip_max={show(high)}: "
                          "clip_min must not exceed clip_max")
    positions(cfg)


def _no_missing(node: DictConfig, prefix: str) -> None:
    """A key its YAML leaves ??? (MISSING) and the command line did not set: one line naming
    it and what to set it to (its schema field's `metadata["allowed"]`)."""
    fields = {f.name: f for f in dataclasses.fields(OmegaConf.get_type(node))}  # its schema's
    for key in node:
        if OmegaConf.is_missing(node, key):
            allowed = fields[key].metadata.get("allowed", "must be set")
            need(False, f"{prefix}.{key}", "???", allowed)


def _unknown_keys(node: DictConfig, prefix: str = "") -> None:
    """`+key=value` slips past Hydra's struct check: refuse keys no schema declares."""
    schema = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(schema):
        allowed = schema_keys(schema)
        for key in node:
            if key not in allowed and not (prefix == "" and key == "hydra"):
                raise ConfigError(f"{prefix}{key}: no such key; allowed: {', '.join(allowed)}")
    for key in node:  # (a group left missing or null has no keys: DictConfig.keys)
        child = node._get_node(key)
        if key != "hydra" and isinstance(child, DictConfig):
            _unknown_keys(child, f"{prefix}{key}.")
