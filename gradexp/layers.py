"""The seed's custom-gradient layer, as a function and as a Keras layer.

    forward   y  = scale · x
    backward  dx = clip_by_value(grad_scale · dy, clip_min, clip_max)

The backward pass does not multiply by `scale` (the seed: x = [1.0], scale 3, bounds ±0.1 gives
y = [3.0], dx = [0.1]). A bound of None means no bound on that side; `grad_scale` < 0 makes a
gradient reversal layer. Non-finite elements of dy pass unclipped, so an overflow stays visible.

The layer also reports what its backward pass did, without side effects: it owns a zero vector
`gradient_stats` (a non-trainable weight) that it passes through the custom gradient as a
second input, and the "gradient" it returns for that input is

    [Σ g², Σ dx², number of clipped elements, number of elements]      (g = grad_scale · dy)

A training step that watches the vector reads these with `tape.gradient`. The entries add up,
so they stay right when a layer is applied at many time steps or on several replicas.
"""

from __future__ import annotations

from gradexp._tf import keras, tf

STATS = ("sum_sq_pre", "sum_sq_post", "clipped", "count")


def _bound(value: float | None, if_none: float, dtype: tf.DType) -> tf.Tensor:
    return tf.constant(if_none if value is None else value, dtype)


@tf.custom_gradient
def _clip_gradient(x, stats, clip_min, clip_max, scale, grad_scale):
    # Positional arguments only: tf.custom_gradient drops keyword arguments (tensorflow#65839).
    def grad(dy):
        g = grad_scale * dy
        dx = tf.where(tf.math.is_finite(g), tf.clip_by_value(g, clip_min, clip_max), g)
        g32, dx32 = tf.cast(g, tf.float32), tf.cast(dx, tf.float32)
        stats_grad = tf.stack([
            tf.reduce_sum(tf.square(g32)),
            tf.reduce_sum(tf.square(dx32)),
            tf.reduce_sum(tf.cast(tf.not_equal(g32, dx32), tf.float32)),
            tf.cast(tf.size(g32), tf.float32),
        ])
        return dx, tf.cast(stats_grad, stats.dtype), None, None, None, None

    return scale * x, grad


def clip_gradient(x, clip_min=None, clip_max=None, scale=1.0, grad_scale=1.0, stats=None):
    """y = scale·x on the way forward; dx = clip_by_value(grad_scale·dy, clip_min, clip_max) back.

    `stats` (optional, a float32 vector of 4 zeros the caller watches) receives the backward
    pass's statistics as its gradient; see the module docstring.
    """
    x = tf.convert_to_tensor(x)
    dtype = x.dtype
    if stats is None:
        stats = tf.zeros([len(STATS)], tf.float32)
    return _clip_gradient(
        x, stats,
        _bound(clip_min, float("-inf"), dtype), _bound(clip_max, float("inf"), dtype),
        tf.constant(scale, dtype), tf.constant(grad_scale, dtype),
    )


@keras.saving.register_keras_serializable(package="gradexp")
class ClipGradient(keras.layers.Layer):
    """Keras layer form of `clip_gradient`; its `gradient_stats` weight carries the statistics."""

    def __init__(self, clip_min=None, clip_max=None, scale=1.0, grad_scale=1.0, **kwargs):
        super().__init__(**kwargs)
        if clip_min is not None and clip_max is not None and clip_min > clip_max:
            raise ValueError(f"clip_min={clip_min} exceeds clip_max={clip_max}")
        self.clip_min, self.clip_max = clip_min, clip_max
        self.scale, self.grad_scale = scale, grad_scale
        self.supports_masking = True

    def build(self, input_shape):
        self.gradient_stats = self.add_weight(
            name="gradient_stats", shape=(len(STATS),), initializer="zeros", trainable=False,
            dtype="float32",
        )

    def call(self, x):
        return clip_gradient(x, self.clip_min, self.clip_max, self.scale, self.grad_scale,
                             tf.convert_to_tensor(self.gradient_stats))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "clip_min": self.clip_min, "clip_max": self.clip_max,
                "scale": self.scale, "grad_scale": self.grad_scale}
