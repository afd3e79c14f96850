"""A model.fit run's config and overrides, read off the compiled model, so that
`python -m gradexp.summarize` groups and compares it as it would a gradexp run of the same
settings (a run's settings are its .hydra/overrides.yaml and its config: analysis.groups).

The config, in gradexp's keys (conf/config.yaml) where they mean the same:

    clip, layer.clip_min, layer.clip_max   c when every ClipGradient bounds dy to ±c (clip null
                         and layer.clip_* null: unbounded), else the layers' own bounds
    layer.scale, grad_scale, max_norm, norm_axis   the layers' settings; a key on which the
                         layers differ holds their values in model order (a list)
    layer.positions      the layers' positions (models.position), [] without any
    optimizer            `name` its class (sgd, adam, ...) and its get_config()'s settings;
                         learning_rate the initial rate as float32 spells it (0.01)
    clipping             the optimizer's own clipnorm / clipvalue / global_clipnorm as
                         gradexp.parts.clipping's norm / value / global_norm (`none` without)
    trainer.loss_reduction  mean (Keras's default: the batch mean) or sum, of the compiled loss
    trainer.steps, trainer.divergence_factor   fit's planned steps (epochs × steps per epoch;
                         null when unknown), and the divergence test's factor
    model.name, seed     the model's name; the seed as the user gives it (null: not said)
    runner               keras.fit (a gradexp run's config has no such key)
    ...                  the user's `settings`, {dotted key: value}, e.g. {"dataset.name": "x"}

The overrides say what sets runs apart, as a gradexp run's say what its user typed: `clip`
always (a sweep's baseline is clip=null), each layer key that differs from ClipGradient's
default, optimizer and optimizer.learning_rate, clipping and its bound unless none,
trainer.loss_reduction, seed when given, and the user's settings.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import numpy as np

from gradexp.parts import models
from gradexp.parts.layers import ClipGradient

RUNNER = "keras.fit"
LAYER_KEYS = ("scale", "grad_scale", "max_norm", "norm_axis")
LAYER_DEFAULTS = {key: parameter.default for key, parameter
                  in inspect.signature(ClipGradient.__init__).parameters.items()}
# Keras's parameter clipping → gradexp.parts.clipping's method that clips as it does, and its key
KERAS_CLIPPING = {"clipnorm": ("norm", "max_norm"), "clipvalue": ("value", "max_value"),
                  "global_clipnorm": ("global_norm", "max_norm")}
REDUCTIONS = {"sum_over_batch_size": "mean", "sum": "sum"}  # Keras's names → gradexp's


def clipping(optimizer) -> dict[str, Any]:
    """The optimizer's parameter clipping as a gradexp.parts.clipping config node."""
    for attribute, (name, key) in KERAS_CLIPPING.items():
        bound = getattr(optimizer, attribute, None)
        if bound is not None:
            return {"name": name, key: float(bound)}
    return {"name": "none"}


def record(model, clip: dict[str, Any], steps: int | None, seed: int | None,
           divergence_factor: float, settings: dict[str, Any]) -> tuple[dict, list[str]]:
    """(config, overrides) of a fit of the compiled `model` (the module docstring); `clip` is
    `clipping(model.optimizer)`."""
    layers = models.clip_layers(model)
    bounds, layer = clip_layer_settings(layers)
    optimizer = optimizer_settings(model.optimizer)
    reduction = loss_reduction(model.loss)
    config = {"runner": RUNNER, "model": {"name": model.name}, "seed": seed,
              "clip": bounds.pop("clip"),
              "layer": {**bounds, **layer, "positions": [models.position(x) for x in layers]},
              "optimizer": optimizer, "clipping": clip,
              "trainer": {"steps": steps, "loss_reduction": reduction,
                          "divergence_factor": float(divergence_factor)}}
    overrides = {"clip": config["clip"],
                 **{f"layer.{k}": v for k, v in bounds.items() if v is not None},
                 **{f"layer.{k}": v for k, v in layer.items() if v != LAYER_DEFAULTS[k]},
                 "optimizer": optimizer["name"]}
    if isinstance(optimizer.get("learning_rate"), float):
        overrides["optimizer.learning_rate"] = optimizer["learning_rate"]
    if clip["name"] != "none":
        overrides.update({"clipping": clip["name"],
                          **{f"clipping.{k}": v for k, v in clip.items() if k != "name"}})
    overrides["trainer.loss_reduction"] = reduction
    if seed is not None:
        overrides["seed"] = seed
    for key, value in settings.items():
        set_dotted(config, key, value)
        overrides[key] = value
    return config, [f"{key}={spelled(value)}" for key, value in overrides.items()]


def clip_layer_settings(layers: list[ClipGradient]) -> tuple[dict, dict]:
    """The clip layers' ({clip, clip_min, clip_max}, {scale, grad_scale, max_norm, norm_axis}):
    each value common to them, or their values in model order. A layer bounded to ±c has clip c
    and no clip_min, clip_max (as gradexp's config says clip=c); one unbounded, all None."""
    def one(values: list):
        return values[0] if len(set(map(repr, values))) == 1 else values

    def symmetric(x) -> bool:
        return (x.clip_min is None and x.clip_max is None) or (
            x.clip_min is not None and x.clip_max is not None and x.clip_min == -x.clip_max)

    if not layers:
        return {"clip": None, "clip_min": None, "clip_max": None}, {}
    bounds = {"clip": one([x.clip_max if symmetric(x) else None for x in layers]),
              **{key: one([None if symmetric(x) else getattr(x, key) for x in layers])
                 for key in ("clip_min", "clip_max")}}
    return bounds, {key: one([getattr(x, key) for x in layers]) for key in LAYER_KEYS}


def optimizer_settings(optimizer) -> dict[str, Any]:
    """`name` (the class, lower case) and the optimizer's get_config() but its name and its
    clipping (the `clipping` node says that); a learning rate as float32 spells it."""
    settings = {"name": type(optimizer).__name__.lower()}
    for key, value in optimizer.get_config().items():
        if key == "name" or key in KERAS_CLIPPING:
            continue
        if isinstance(value, (float, np.floating)):
            value = float(str(np.float32(value)))  # 0.009999999776482582 → 0.01
        if _is_plain(value):
            settings[key] = value
    return settings


def loss_reduction(loss) -> str:
    """gradexp's name of the compiled loss's reduction: a Loss object's own, else Keras's
    default for a loss given by name or function (the batch mean)."""
    reduction = getattr(loss, "reduction", "sum_over_batch_size")
    return REDUCTIONS.get(reduction, str(reduction))


def set_dotted(config: dict, key: str, value: Any) -> None:
    """config[a][b] = value for key `a.b`."""
    *path, last = key.split(".")
    for part in path:
        config = config.setdefault(part, {})
    config[last] = value


def spelled(value: Any) -> str:
    """A value as a Hydra override spells it: null, true, 0.1, [a,b]."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(spelled, value)) + "]"
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return str(value)


def _is_plain(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True

