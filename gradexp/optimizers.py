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


def apply_in_scope(optimizer, grads: list, params: list, scope) -> None:
    """`optimizer.apply(grads, params)` on the values a keras.StatelessScope holds (gradexp/
    batched.py). Keras's TensorFlow optimizers cannot update stateless (they need tf.Variables
    for tf.distribute), so their rules are restated here, operation for operation as Keras 3
    computes them, with t = iterations + 1 and lr the learning rate:

        SGD   m ← m·momentum − g·lr,  θ ← θ + m     (nesterov: θ ← θ + m·momentum − g·lr,
              with the new m; momentum 0: θ ← θ − g·lr)
        Adam  α = lr·sqrt(1 − β2^t) / (1 − β1^t),  m ← m + (g − m)(1 − β1),
              v ← v + (g² − v)(1 − β2),  θ ← θ − m·α / (sqrt(v) + ε)

    then iterations ← t. None gradients leave their parameter as it is."""
    from gradexp._tf import tf

    read = scope.get_current_value

    def add(variable, delta):
        scope.add_update((variable, read(variable) + delta))

    lr = tf.convert_to_tensor(optimizer.learning_rate)
    t = read(optimizer.iterations) + 1
    for i, (g, v) in enumerate(zip(grads, params, strict=True)):
        if g is None:
            continue
        dtype = v.dtype
        g, rate = tf.cast(g, dtype), tf.cast(lr, dtype)
        if isinstance(optimizer, keras.optimizers.SGD) and optimizer.momentum == 0:
            add(v, -(g * rate))
        elif isinstance(optimizer, keras.optimizers.SGD):
            m, momentum = optimizer.momentums[i], tf.cast(optimizer.momentum, dtype)
            scope.add_update((m, read(m) * momentum - g * rate))
            add(v, read(m) * momentum - g * rate if optimizer.nesterov else read(m))
        elif isinstance(optimizer, keras.optimizers.Adam) and not optimizer.amsgrad:
            step = tf.cast(t, dtype)
            b1, b2 = tf.cast(optimizer.beta_1, dtype), tf.cast(optimizer.beta_2, dtype)
            alpha = rate * tf.sqrt(1 - tf.pow(b2, step)) / (1 - tf.pow(b1, step))
            m, s = optimizer._momentums[i], optimizer._velocities[i]
            add(m, (g - read(m)) * (1 - optimizer.beta_1))
            add(s, (tf.square(g) - read(s)) * (1 - optimizer.beta_2))
            add(v, -((read(m) * alpha) / (tf.sqrt(read(s)) + optimizer.epsilon)))
        else:
            raise TypeError(f"{type(optimizer).__name__}: no stateless update")
    scope.add_update((optimizer.iterations, t))
