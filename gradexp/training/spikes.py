"""Spike detection for `trainer.on_spike=skip`: a step whose loss or global gradient norm (before
clipping) jumps above its running statistics is not applied.

For each of x ∈ {loss, ‖g‖}, with z_t = `spike_z`, W = `spike_warmup`, α = `spike_alpha`:

    warm-up: the first W steps set μ and σ² to the mean and variance of their values (Welford);
             nothing is a spike
    then:    spike(x) = (x − μ) / (σ + 1e-12) > z_t          (upward jumps only)
             a step is skipped when spike(loss) or spike(‖g‖), or either is not finite
    update:  with a step that is not skipped: μ ← α·μ + (1 − α)·x,  σ² ← α·σ² + (1 − α)·(x − μ)²
             (μ the new mean); a skipped step leaves the statistics alone, so that a spike does
             not raise the bar for the next one

The step carries the statistics and a checkpoint saves them: a resumed run skips what an
uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from gradexp._tf import tf

EPS = 1e-12


class SpikeState(NamedTuple):
    """Steps recorded, and the running mean and variance of [loss, ‖g‖]."""

    seen: tf.Tensor  # int64
    mean: tf.Tensor  # [loss, norm]
    var: tf.Tensor


@dataclass(frozen=True)
class SpikeDetector:
    """`skip, state = detector.update(state, loss, norm)`: whether the step is skipped, and the
    statistics after it (the module docstring); `init()` the statistics before the first step."""

    z: float
    warmup: int
    alpha: float

    def init(self) -> SpikeState:
        return SpikeState(tf.constant(0, tf.int64), tf.zeros([2]), tf.zeros([2]))

    def update(self, state: SpikeState, loss, norm) -> tuple[tf.Tensor, SpikeState]:
        x = tf.stack([tf.cast(loss, tf.float32), tf.cast(norm, tf.float32)])
        z = (x - state.mean) / (tf.sqrt(state.var) + EPS)
        warming = state.seen < self.warmup
        skip = tf.logical_not(tf.reduce_all(tf.math.is_finite(x))) | (
            ~warming & tf.reduce_any(z > self.z))
        keep = tf.logical_not(skip)
        n = tf.cast(state.seen + 1, tf.float32)
        # Welford during the warm-up: exact mean and (population) variance of the values so far
        welford_mean = state.mean + (x - state.mean) / n
        welford_var = (state.var * (n - 1) + (x - state.mean) * (x - welford_mean)) / n
        ema_mean = self.alpha * state.mean + (1 - self.alpha) * x
        ema_var = self.alpha * state.var + (1 - self.alpha) * tf.square(x - ema_mean)
        new_mean = tf.where(warming, welford_mean, ema_mean)
        new_var = tf.where(warming, welford_var, ema_var)
        return skip, SpikeState(state.seen + tf.cast(keep, tf.int64),
                                tf.where(keep, new_mean, state.mean),
                                tf.where(keep, new_var, state.var))
