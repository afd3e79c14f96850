"""The optimizer of a run: each factory registered by `@optimizer(name)` under its schema's name
(gradexp/config/optimizer.py), and `make_optimizer`, which adds loss scaling when the precision
asks for it."""

from __future__ import annotations

from omegaconf import DictConfig

from gradexp._tf import keras
from gradexp.config import Registry

OPTIMIZERS = Registry("optimizer", "factory", "gradexp/optimizers.py")
optimizer = OPTIMIZERS.add  # @optimizer("sgd"): the factory of optimizer=sgd


@optimizer("sgd")
def sgd(o: DictConfig):
    return keras.optimizers.SGD(o.learning_rate, momentum=o.momentum, nesterov=o.nesterov)


@optimizer("adam")
def adam(o: DictConfig):
    return keras.optimizers.Adam(o.learning_rate, beta_1=o.beta_1, beta_2=o.beta_2,
                                 epsilon=o.epsilon)


def make_optimizer(o: DictConfig, precision: str):
    """The optimizer of `o`; under mixed_float16 inside Keras's dynamic loss scaling."""
    made = OPTIMIZERS[o.name](o)
    if precision == "mixed_float16":
        return keras.optimizers.LossScaleOptimizer(made)
    return made
