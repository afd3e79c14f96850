"""The seed's custom-gradient layer, as a function and as a Keras layer.

    forward   y  = scale · x
    backward  g  = grad_scale · dy
              dx = clip_by_value(g, clip_min, clip_max)                          (the seed)
              dx = dx · min(1, max_norm / ‖dx‖)    if max_norm is set: the norm over the whole
                                                   batch, or over each example (norm_axis)

The backward pass does not multiply by `scale` (the seed: x = [1.0], scale 3, bounds ±0.1 gives
y = [3.0], dx = [0.1]). A bound of None means no bound on that side; `grad_scale` < 0 makes a
gradient reversal layer. Non-finite elements of g pass unclipped (and a norm that is not finite
rescales nothing), so an overflow stays visible and a loss-scale optimizer can skip the step.

Mixed precision: given the loss scale S (dy is S times the true one), the backward pass works
in float32 on g / S, clips in true units and hands back S · dx in dy's dtype, so a bound means
the same in float16 or bfloat16 as in float32.

The layer also reports what its backward pass did, without side effects: its zero vector
`gradient_stats` (a non-trainable weight) passes through the custom gradient as a second input,
and the "gradient" it returns for that input is, in true units,

    [Σ g², Σ dx², number of elements changed, number of elements]

A training step that watches the vector reads these with `tape.gradient`. The entries add up,
so they stay right when a layer is applied at many time steps or on several replicas.
"""

from __future__ import annotations

from gradexp._tf import keras, tf
from gradexp.config import NORM_AXES

STATS = ("sum_sq_pre", "sum_sq_post", "clipped", "count")
MATVEC_SUM_FROM = 2**16  # elements: see `total`


def total(x, small_in=None) -> tf.Tensor:
    """Σ x over every element. From MATVEC_SUM_FROM elements, a matrix-vector product with ones
    (each row's sum), then a sum over the rows: XLA hands the product to Eigen, on every core,
    where its own reduction is one loop on one. Below it XLA's reduction, fused into the backward
    pass, is the faster; `small_in` (e.g. tf.float64) accumulates it in another dtype, so that
    the order of the sum, which follows the tensor's layout, cannot show."""
    if not x.shape.is_fully_defined() or x.shape.num_elements() < MATVEC_SUM_FROM:
        return tf.cast(tf.reduce_sum(tf.cast(x, small_in or x.dtype)), x.dtype)
    rows = tf.reshape(x, [-1, x.shape[-1]])
    return tf.reduce_sum(tf.linalg.matvec(rows, tf.ones([x.shape[-1]], x.dtype)))


def _backward(dy, clip_min, clip_max, max_norm, grad_scale, loss_scale, per_example):
    """dx and the statistics vector for upstream gradient dy (the module docstring). Bounds are
    Python numbers or None, where what is not asked for costs no op (the unclipped baseline's
    backward pass is one multiply at most, its statistics one sum of squares), or float32 scalar
    tensors (the layer's: ±inf for no bound)."""
    g = tf.cast(dy, tf.float32)
    if grad_scale != 1.0:
        g = g * grad_scale
    if loss_scale is not None:
        g = g / loss_scale
    sum_sq_pre = total(tf.square(g))
    count = tf.cast(tf.size(g), tf.float32)
    if clip_min is None and clip_max is None and max_norm is None:
        dx, stats = g, tf.stack([sum_sq_pre, sum_sq_pre, 0.0, count])
    else:
        dx, finite = g, tf.math.is_finite(g)
        if clip_min is not None or clip_max is not None:
            low = float("-inf") if clip_min is None else clip_min
            high = float("inf") if clip_max is None else clip_max
            dx = tf.where(finite, tf.clip_by_value(g, low, high), g)
        if max_norm is not None:
            if per_example:
                # every axis but the first; none for a rank-1 dx, whose examples are its
                # elements (`[] or None` would have meant the whole batch)
                axes = list(range(1, len(g.shape)))
                norm = tf.sqrt(tf.reduce_sum(tf.square(dx), axis=axes, keepdims=True))
            else:
                norm = tf.norm(dx)
            factor = tf.where(tf.math.is_finite(norm) & (norm > max_norm),
                              max_norm / tf.maximum(norm, 1e-30), 1.0)
            dx = dx * factor
        stats = tf.stack([
            sum_sq_pre,
            total(tf.square(dx)),
            total(tf.cast(tf.not_equal(g, dx) & finite, tf.float32)),
            count,
        ])
    if loss_scale is not None:
        dx = dx * loss_scale
    return tf.cast(dx, dy.dtype), stats


def clip_gradient(x, clip_min=None, clip_max=None, scale=1.0, grad_scale=1.0, *,
                  max_norm=None, norm_axis="batch", loss_scale=None, stats=None, bounds=None):
    """y = scale·x forward; dx = clip_by_value(grad_scale·dy, clip_min, clip_max) backward, with
    max_norm / norm_axis a norm bound on dx; loss_scale (a float32 scalar tensor or variable) is
    the mixed-precision loss scale dy carries; `stats` (a float32 vector of 4 zeros the caller
    watches) receives the backward pass's statistics as its gradient. `bounds`, a float32 tensor
    [low, high] (±inf: no bound), takes the place of clip_min and clip_max: data, not program,
    so that runs differing only in them share one compiled step (gradexp/training/engine.py).
    Clipping to ±inf leaves dy as it is, bit for bit."""
    if norm_axis not in NORM_AXES:
        raise ValueError(f"norm_axis={norm_axis}: must be one of {', '.join(NORM_AXES)}")
    x = tf.convert_to_tensor(x)
    if stats is None:
        stats = tf.zeros([len(STATS)], tf.float32)
    given = bounds is not None
    bounds = tf.zeros([2], tf.float32) if bounds is None else bounds

    # Only tensors cross tf.custom_gradient, positionally (it drops keyword arguments,
    # tensorflow#65839); the loss scale is read inside the backward pass, when it is known.
    @tf.custom_gradient
    def op(x, stats, bounds):
        def grad(dy):
            s = None if loss_scale is None else tf.cast(tf.convert_to_tensor(loss_scale),
                                                        tf.float32)
            low, high = (bounds[0], bounds[1]) if given else (clip_min, clip_max)
            dx, stats_grad = _backward(dy, low, high, max_norm, grad_scale, s,
                                       norm_axis == "example")
            return dx, stats_grad, tf.zeros_like(bounds)

        return (x if scale == 1.0 else tf.cast(scale, x.dtype) * x), grad

    return op(x, stats, bounds)


@keras.saving.register_keras_serializable(package="gradexp")
class ClipGradient(keras.layers.Layer):
    """Keras layer form of `clip_gradient`; its `gradient_stats` weight carries the statistics.
    `follow_loss_scale(variable)` (not part of its config) tells it where the mixed-precision
    loss scale lives (e.g. a LossScaleOptimizer's `dynamic_scale`)."""

    # Keras reads this signature when it makes the layer: mutation testing leaves it whole
    # (mutmut's wrapper would hide it; tests/mutation.py)
    def __init__(self, clip_min=None, clip_max=None, scale=1.0, grad_scale=1.0,
                 max_norm=None, norm_axis="batch", **kwargs):  # pragma: no mutate block
        super().__init__(**kwargs)
        if clip_min is not None and clip_max is not None and clip_min > clip_max:
            raise ValueError(f"clip_min={clip_min} exceeds clip_max={clip_max}")
        if max_norm is not None and not max_norm > 0:
            raise ValueError(f"max_norm={max_norm}: must be positive")
        if norm_axis not in NORM_AXES:
            raise ValueError(f"norm_axis={norm_axis}: must be one of {', '.join(NORM_AXES)}")
        self.clip_min, self.clip_max = clip_min, clip_max
        self.scale, self.grad_scale = scale, grad_scale
        self.max_norm, self.norm_axis = max_norm, norm_axis
        self._loss_scale = lambda: None  # a function, so Keras does not track the variable
        self.supports_masking = True

    def follow_loss_scale(self, variable) -> None:
        self._loss_scale = lambda: variable

    def build(self, input_shape):
        self.gradient_stats = self.add_weight(
            name="gradient_stats", shape=(len(STATS),), initializer="zeros", trainable=False,
            dtype="float32",
        )
        low = float("-inf") if self.clip_min is None else self.clip_min
        high = float("inf") if self.clip_max is None else self.clip_max
        self.clip_bounds = self.add_weight(  # data, not program: see clip_gradient's `bounds`
            name="clip_bounds", shape=(2,), trainable=False, dtype="float32", autocast=False,
            initializer=lambda shape, dtype: tf.constant([low, high], dtype))  # float32 always

    def call(self, x):
        return clip_gradient(
            x, self.clip_min, self.clip_max, self.scale, self.grad_scale,
            max_norm=self.max_norm, norm_axis=self.norm_axis, loss_scale=self._loss_scale(),
            stats=tf.convert_to_tensor(self.gradient_stats),
            bounds=tf.convert_to_tensor(self.clip_bounds))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "clip_min": self.clip_min, "clip_max": self.clip_max,
                "scale": self.scale, "grad_scale": self.grad_scale, "max_norm": self.max_norm,
                "norm_axis": self.norm_axis}
