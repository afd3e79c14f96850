"""Clipping to a fixed bound, stateless: none at all and Keras 3's own three.

    none         g ← g                                            threshold = inf
    value        g ← clip(g, −v, v), elementwise                  threshold = v  (Keras `clipvalue`)
    norm         each tensor: g_i ← g_i · c/‖g_i‖ if ‖g_i‖ > c    threshold = c  (Keras `clipnorm`)
    global_norm  all together: g ← g · c/‖g‖ if ‖g‖ > c           threshold = c  (`global_clipnorm`)

global_norm is Pascanu, Mikolov & Bengio 2013, "On the difficulty of training recurrent neural
networks". Each function below says how far it matches Keras bit for bit.
"""

from __future__ import annotations

from gradexp._tf import tf
from gradexp.parts.clipping.common import INF, any_of, clip_stats, global_norm, rescale, stateless


@stateless("none")
def no_clipping(grads: list) -> tuple[list, dict]:
    """g ← g. threshold = inf."""
    norm = global_norm(grads)
    return list(grads), clip_stats(norm, grads, INF, False)


@stateless("value", "max_value")
def clip_by_value(grads: list, max_value: float) -> tuple[list, dict]:
    """g ← clip(g, −v, v), as Keras `clipvalue` (tf.clip_by_value). threshold = v."""
    norm = global_norm(grads)
    finite = tf.math.is_finite(norm)
    out = [tf.where(finite, tf.clip_by_value(g, -max_value, max_value), g) for g in grads]
    clipped = finite & any_of([tf.reduce_any(tf.abs(g) > max_value) for g in grads])
    return out, clip_stats(norm, out, max_value, clipped)


@stateless("norm", "max_norm")
def clip_by_norm(grads: list, max_norm: float) -> tuple[list, dict]:
    """Keras `clipnorm`, tf.clip_by_norm's (g_i · c) / max(‖g_i‖, c) for every tensor: the same
    expression where it clips (bit for bit), g_i left alone elsewhere (Keras' (g·c)/c may move it
    by a rounding); in float32, cast back to g's dtype. threshold = c; the global norm after is
    ≤ c·sqrt(#tensors)."""
    norm = global_norm(grads)
    finite = tf.math.is_finite(norm)
    out, over = [], []
    for g in grads:
        g32 = tf.cast(g, tf.float32)  # a float16 g² overflows from |g| ≈ 256 (a no-op for float32)
        tensor_norm = tf.sqrt(tf.reduce_sum(g32 * g32, axis=None, keepdims=True))
        too_long = finite & (tensor_norm > max_norm)
        out.append(tf.where(too_long, tf.cast(g32 * max_norm / tensor_norm, g.dtype), g))
        over.append(tf.reduce_any(too_long))
    return out, clip_stats(norm, out, max_norm, any_of(over))


@stateless("global_norm", "max_norm")
def clip_by_global_norm(grads: list, max_norm: float) -> tuple[list, dict]:
    """Keras `global_clipnorm`, its factor c · (1/‖g‖) where it clips (bit for bit); below the
    bound g is left as it is (Keras multiplies by c · (1/c), maybe 1 off by a rounding).
    threshold = c. c = None never clips (as `none`): the baseline of a sweep over c."""
    if max_norm is None:
        return no_clipping(grads)
    norm = global_norm(grads)
    clipped = tf.math.is_finite(norm) & (norm > max_norm)
    out = rescale(grads, tf.where(clipped, max_norm * (1.0 / norm), 1.0))
    return out, clip_stats(norm, out, max_norm, clipped)
