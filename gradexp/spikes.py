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

The statistics are variables saved in each checkpoint: a resumed run skips the steps an
uninterrupted one would.
"""

from __future__ import annotations

from gradexp._tf import tf

EPS = 1e-12


def _variable(value, name: str) -> tf.Variable:
    return tf.Variable(value, trainable=False, name=f"spikes/{name}",
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


class SpikeDetector:
    """`is_spike(loss, norm)` → bool tensor; `record(loss, norm, skipped)` advances the
    statistics (the module docstring). `variables`: what a checkpoint keeps."""

    def __init__(self, z: float, warmup: int, alpha: float):
        self.z, self.warmup, self.alpha = float(z), int(warmup), float(alpha)
        self.seen = _variable(tf.constant(0, tf.int64), "seen")
        self.mean = _variable(tf.zeros([2]), "mean")  # [loss, norm]
        self.var = _variable(tf.zeros([2]), "var")

    @property
    def variables(self) -> list[tf.Variable]:
        return [self.seen, self.mean, self.var]

    def is_spike(self, loss, norm) -> tf.Tensor:
        x = tf.stack([tf.cast(loss, tf.float32), tf.cast(norm, tf.float32)])
        z = (x - self.mean) / (tf.sqrt(self.var) + EPS)
        ready = self.seen >= self.warmup
        return tf.logical_not(tf.reduce_all(tf.math.is_finite(x))) | (
            ready & tf.reduce_any(z > self.z))

    def record(self, loss, norm, skipped) -> None:
        x = tf.stack([tf.cast(loss, tf.float32), tf.cast(norm, tf.float32)])
        keep = tf.logical_not(skipped)
        seen = self.seen.read_value()
        n = tf.cast(seen + 1, tf.float32)
        warming = seen < self.warmup
        # Welford during the warm-up: exact mean and (population) variance of the values so far
        welford_mean = self.mean + (x - self.mean) / n
        welford_var = (self.var * (n - 1) + (x - self.mean) * (x - welford_mean)) / n
        ema_mean = self.alpha * self.mean + (1 - self.alpha) * x
        ema_var = self.alpha * self.var + (1 - self.alpha) * tf.square(x - ema_mean)
        new_mean = tf.where(warming, welford_mean, ema_mean)
        new_var = tf.where(warming, welford_var, ema_var)
        self.mean.assign(tf.where(keep, new_mean, self.mean))
        self.var.assign(tf.where(keep, new_var, self.var))
        self.seen.assign_add(tf.cast(keep, tf.int64))
