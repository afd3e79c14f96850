"""The `layer` node (conf/config.yaml): the settings of the clip layers inserted in the model,
and `clip_spec`, which resolves them once (with the top-level `clip` and the model's positions)
into the ClipSpec that gradexp/parts/models.py builds the layers from."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from gradexp.config.base import ConfigError, finite, need, one_of

NORM_AXES = ("batch", "example")


@dataclass
class LayerConfig:
    """The seed's layer: forward y = scale·x, backward dx = clip(grad_scale·dy, clip_min, clip_max).

    clip_min / clip_max override the top-level `clip` (which means ±clip); null: no bound.
    max_norm: then rescale dx to norm <= max_norm, over the batch or per example (norm_axis).
    positions: `all` (after every hidden layer), or a list of the model's position names.
    """

    clip_min: float | None = None  # overrides -clip
    clip_max: float | None = None  # overrides +clip
    max_norm: float | None = None  # then rescale dx to norm <= max_norm ...
    norm_axis: str = "batch"  # ... over the whole batch, or per example
    scale: float = 1.0  # forward y = scale·x; dx is not multiplied by it
    grad_scale: float = 1.0  # -1: gradient reversal
    positions: Any = "all"  # all hidden layers, or a list such as [dense_1,dense_3]

    def check(self) -> None:
        for side in ("clip_min", "clip_max"):
            value = getattr(self, side)
            need(value is None or not math.isnan(value), side, value, "must be a number or null")
        need(self.max_norm is None or (finite(self.max_norm) and self.max_norm > 0), "max_norm",
             self.max_norm, "must be a positive number or null")
        one_of("norm_axis", self.norm_axis, NORM_AXES)
        need(finite(self.scale), "scale", self.scale, "must be a finite number")
        need(finite(self.grad_scale), "grad_scale", self.grad_scale,
             "must be a finite number (negative reverses the gradient)")


@dataclass(frozen=True)
class ClipSpec:
    """What every clip layer of a run is: ClipGradient's arguments, and where the layers go
    (`positions`, in model order)."""

    clip_min: float | None
    clip_max: float | None
    scale: float
    grad_scale: float
    max_norm: float | None
    norm_axis: str
    positions: tuple[str, ...]


def clip_spec(cfg: DictConfig) -> ClipSpec:
    """The clip layers of `cfg` (its `layer` node, `clip` and the model's positions)."""
    clip_min, clip_max = clip_bounds(cfg)
    layer = cfg.layer
    return ClipSpec(clip_min, clip_max, layer.scale, layer.grad_scale, layer.max_norm,
                    layer.norm_axis, tuple(positions(cfg)))


def clip_bounds(cfg: DictConfig) -> tuple[float | None, float | None]:
    """(clip_min, clip_max) of the inserted layers: layer.clip_min/max, else ±clip, else None."""
    low, high = cfg.layer.clip_min, cfg.layer.clip_max
    if cfg.clip is not None:
        low = -cfg.clip if low is None else low
        high = cfg.clip if high is None else high
    return low, high


def positions(cfg: DictConfig) -> list[str]:
    """The model positions that get a clip layer, in model order (a user's model: the names and
    patterns asked for, `all` as `["all"]`, resolved against its layers when it is built)."""
    available = OmegaConf.to_object(cfg.model).positions()
    wanted = cfg.layer.positions
    if not isinstance(wanted, (list, ListConfig)):  # one name (Hydra reads `3` as a number)
        wanted = [wanted]
    if available is None:
        return [str(p) for p in wanted]
    if wanted == ["all"]:
        return available
    unknown = [p for p in wanted if p not in available]
    if unknown:
        raise ConfigError(
            f"layer.positions={unknown[0]}: no such position in model={cfg.model.name}; "
            f"allowed: all, or a list of {', '.join(available)}"
        )
    return [p for p in available if p in wanted]
