"""AutoClip (Seetharaman, Wichern, Pardo & Le Roux 2020, "AutoClip: Adaptive Gradient Clipping
for Source Separation Networks"; github.com/pseeth/autoclip):

    h ← h ∪ {‖g‖}              (appended before the percentile, as in the paper's code)
    T = percentile_p(h)
    g ← g · T / ‖g‖            where ‖g‖ > T

h keeps the last `size` norms. threshold = T. The paper's code rescales by T / (‖g‖ + 1e-6)
(torch's clip_grad_norm_); we rescale to exactly T. Not idempotent: clipping the same gradient
again from the same state records T instead of ‖g‖, which may lower the percentile below T.
"""

from __future__ import annotations

from typing import NamedTuple

from gradexp._tf import tf
from gradexp.parts.clipping.common import INF, Method, clip_stats, global_norm, method, rescale


class NormHistory(NamedTuple):
    """The last `size` finite global norms, twice: `arrivals` in arrival order (the next one goes
    to slot count mod size) and `ascending` the same values sorted (kept sorted by a few O(size)
    vector operations per step, cheaper than a sort), +inf in slots not yet filled."""

    arrivals: tf.Tensor
    ascending: tf.Tensor
    count: tf.Tensor  # norms recorded so far (int64)

    @classmethod
    def create(cls, size: int) -> NormHistory:
        return cls(tf.fill([size], INF), tf.fill([size], INF), tf.constant(0, tf.int64))


def record(history: NormHistory, norm: tf.Tensor, keep: tf.Tensor) -> NormHistory:
    """`history` with `norm` added if `keep`, the oldest norm evicted once the history is full."""
    size = history.ascending.shape[0]
    i = tf.range(size, dtype=tf.int64)
    slot = history.count % size
    evicted = tf.where(history.count >= size, tf.gather(history.arrivals, slot), INF)
    old = history.ascending

    def below(value):
        return tf.reduce_sum(tf.cast(old < value, tf.int64))

    # `evicted` leaves position r (its first occurrence); `norm` enters at s, counted without it.
    r = below(evicted)
    s = below(norm) - tf.cast(evicted < norm, tf.int64)
    old_next = tf.concat([old[1:], [INF]], 0)  # old[i + 1]
    old_prev = tf.concat([[INF], old[:-1]], 0)  # old[i - 1]
    without = tf.where(i < r, old, old_next)  # old with position r removed
    without_prev = tf.where(i - 1 < r, old_prev, old)  # without[i - 1]
    new = tf.where(i < s, without, tf.where(i == s, norm, without_prev))
    return NormHistory(tf.where(keep & (i == slot), norm, history.arrivals),
                       tf.where(keep, new, old), history.count + tf.cast(keep, tf.int64))


def percentile(history: NormHistory, p: float) -> tf.Tensor:
    """numpy.percentile(history, p) with numpy's default ('linear') method; inf while empty.

        q = p/100, position = n·q + (1 − q) − 1   (numpy's form of q·(n − 1)), k = ⌊position⌋,
        t = position − k, a = sorted norms:  a_k + t·(a_{k+1} − a_k)
        (numpy computes a_{k+1} − (1 − t)·(a_{k+1} − a_k) when t ≥ 0.5; so do we, in float64)
    """
    size = history.ascending.shape[0]
    n = tf.minimum(history.count, size)
    last = tf.cast(tf.maximum(n - 1, 0), tf.float64)
    q = p / 100.0
    position = tf.clip_by_value(tf.cast(n, tf.float64) * q + (1.0 - q) - 1.0, 0.0, last)
    k = tf.floor(position)
    t = position - k
    lower = tf.cast(k, tf.int64)
    upper = tf.minimum(lower + 1, tf.cast(last, tf.int64))
    a = tf.cast(tf.gather(history.ascending, lower), tf.float64)
    b = tf.cast(tf.gather(history.ascending, upper), tf.float64)
    value = tf.where(t >= 0.5, b - (b - a) * (1.0 - t), a + (b - a) * t)
    return tf.where(n > 0, tf.cast(value, tf.float32), INF)


def autoclip(grads: list, history: NormHistory, p: float) -> tuple[list, NormHistory, dict]:
    """AutoClip (the module docstring) at the p-th percentile of `history`. threshold = T."""
    norm = global_norm(grads)
    finite = tf.math.is_finite(norm)
    history = record(history, norm, finite)
    threshold = percentile(history, p)
    clipped = finite & (norm > threshold)
    out = rescale(grads, tf.where(clipped, threshold / norm, 1.0))
    return out, history, clip_stats(norm, out, threshold, clipped)


@method("autoclip")
def _autoclip(c, params, output_params) -> Method:
    size, clip_percentile = int(c.history), float(c.percentile)
    return Method(c.name, lambda: NormHistory.create(size),
                  lambda grads, history, params: autoclip(grads, history, clip_percentile))
