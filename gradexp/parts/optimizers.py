"""The optimizer of a run, made by the factory `@optimizer(name)` registers under its schema's
name (gradexp/config/optimizer.py), and `stateless_update`, by which the training step updates a
run's state as a value (gradexp/training/step.py)."""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

from gradexp._tf import keras
from gradexp.config import ConfigError, Registry, import_object

OPTIMIZERS = Registry("optimizer", "factory", "gradexp/parts/optimizers.py")
optimizer = OPTIMIZERS.add  # @optimizer("sgd"): the factory of optimizer=sgd


@optimizer("sgd")
def sgd(o: DictConfig):
    return keras.optimizers.SGD(o.learning_rate, momentum=o.momentum, nesterov=o.nesterov)


@optimizer("adam")
def adam(o: DictConfig):
    return keras.optimizers.Adam(o.learning_rate, beta_1=o.beta_1, beta_2=o.beta_2,
                                 epsilon=o.epsilon)


@optimizer("adamw")
def adamw(o: DictConfig):
    return keras.optimizers.AdamW(o.learning_rate, weight_decay=o.weight_decay, beta_1=o.beta_1,
                                  beta_2=o.beta_2, epsilon=o.epsilon)


@optimizer("keras")
def any_keras(o: DictConfig):
    """keras.optimizers.<class_name>, or the class a dotted path names, with its kwargs."""
    kwargs = {"learning_rate": o.learning_rate, **OmegaConf.to_container(o.kwargs)}
    dotted = "." in o.class_name or ":" in o.class_name
    known = [n for n in dir(keras.optimizers) if isinstance(getattr(keras.optimizers, n), type)
             and issubclass(getattr(keras.optimizers, n), keras.optimizers.Optimizer)
             and n not in ("Optimizer", "LossScaleOptimizer", "MultiOptimizer")]
    if not dotted and o.class_name not in known:
        raise ConfigError(f"optimizer.class_name={o.class_name}: no such Keras optimizer; "
                          f"choose one of {', '.join(known)}, or a dotted path")
    make = (import_object("optimizer.class_name", o.class_name) if dotted
            else getattr(keras.optimizers, o.class_name))
    try:
        made = make(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"optimizer.kwargs: {o.class_name} refused them ({exc})") from None
    if not isinstance(made, keras.optimizers.Optimizer):
        raise ConfigError(f"optimizer.class_name={o.class_name}: made a "
                          f"{type(made).__name__}, not a Keras optimizer")
    return made


def make_optimizer(o: DictConfig, precision: str):
    """The optimizer of `o`; under mixed_float16 inside Keras's dynamic loss scaling."""
    made = OPTIMIZERS[o.name](o)
    if precision == "mixed_float16":
        return keras.optimizers.LossScaleOptimizer(made)
    return made


Update = Callable[[list, list, list], tuple[list, list]]


def stateless_update(optimizer, params: list) -> Update:
    """`update(optimizer_values, grads, param_values) -> (param_values, optimizer_values)`:
    Keras's `optimizer.stateless_apply` (BaseOptimizer's: the variables mapped to the values,
    the optimizer's own `apply`) for an optimizer built on `params`, its variables untouched,
    under the TensorFlow backend too, whose TFOptimizer refuses it and routes `update_step`'s
    `self.assign*` to tf.Variables (keras/src/backend/tensorflow/optimizer.py). While `update`
    runs, BaseOptimizer's own assign, assign_add, assign_sub, update loop, weight decay and
    stateless_apply stand again, the variables' keys computed beforehand (TFOptimizer reads them
    from the values): the arithmetic is the optimizer's own, for any Keras optimizer (a
    LossScaleOptimizer keeps its stateless_apply, the inner one takes this path)."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    optimizers = [optimizer, *([optimizer.inner_optimizer] if scaled else [])]
    keys = [{id(v): o._var_key(v) for v in params} for o in optimizers]
    overrides = ("assign", "assign_add", "assign_sub", "_backend_update_step",
                 "_apply_weight_decay")

    def update(optimizer_values: list, grads: list, param_values: list):
        for o, key in zip(optimizers, keys, strict=True):  # Keras's own path, while it runs
            names = [*overrides, *(["stateless_apply"] if not (scaled and o is optimizer) else [])]
            for name in names:
                setattr(o, name, getattr(BaseOptimizer, name).__get__(o))
            o._var_key = lambda v, key=key: key[id(v)]
        try:
            return optimizer.stateless_apply(list(optimizer_values), list(grads),
                                             list(param_values))
        finally:
            for o in optimizers:
                for name in (*overrides, "stateless_apply", "_var_key"):
                    o.__dict__.pop(name, None)

    return update
