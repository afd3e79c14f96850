"""Keras models with clip layers at named positions.

Each builder calls `tap(name, x)` at every position where a clip layer may go (the names are the
schema's `positions()`, see gradexp/config.py); `tap` inserts a `ClipGradient` layer named
`clip_<name>` where the config asks for one and passes `x` through elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

from gradexp._tf import keras
from gradexp.config import clip_bounds, positions
from gradexp.layers import ClipGradient

Tap = Callable[[str, "keras.KerasTensor"], "keras.KerasTensor"]


def mlp(m: DictConfig, x, num_outputs: int, tap: Tap):
    x = keras.layers.Flatten(name="flatten")(x)
    for name in OmegaConf.to_object(m).positions():
        x = keras.layers.Dense(m.width, m.activation, kernel_initializer=m.initializer,
                               name=name)(x)
        x = tap(name, x)
    return keras.layers.Dense(num_outputs, kernel_initializer=m.initializer, name="head")(x)


BUILDERS = {"mlp": mlp}


def build(cfg: DictConfig, input_shape: tuple[int, ...], num_outputs: int) -> keras.Model:
    """The model of `cfg.model`, with clip layers at `cfg.layer.positions`; its output layer,
    `head`, gives logits (classification) or the predicted value (regression)."""
    clip_min, clip_max = clip_bounds(cfg)
    chosen = positions(cfg)
    tapped = []

    def tap(name, x):
        tapped.append(name)
        if name not in chosen:
            return x
        return ClipGradient(clip_min, clip_max, cfg.layer.scale, cfg.layer.grad_scale,
                            name=f"clip_{name}")(x)

    inputs = keras.Input(input_shape, name="inputs")
    outputs = BUILDERS[cfg.model.name](cfg.model, inputs, num_outputs, tap)
    expected = OmegaConf.to_object(cfg.model).positions()
    assert tapped == expected, f"{cfg.model.name} tapped {tapped}, schema says {expected}"
    return keras.Model(inputs, outputs, name=cfg.model.name)


def clip_layers(model: keras.Model) -> list[ClipGradient]:
    """The model's clip layers, in model order."""
    return [layer for layer in model.layers if isinstance(layer, ClipGradient)]
