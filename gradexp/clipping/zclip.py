"""ZClip (Kumar, Owen, Roy Chowdhury & Güra 2025, "ZClip: Adaptive Spike Mitigation for LLM
Pre-Training"; github.com/bluorion-com/ZClip, mode="zscore", clip_option="adaptive_scaling",
the paper's "reciprocal" clipping). With g = ‖g‖:

    warm-up: the first W finite norms are collected, nothing is clipped; the W-th sets
             μ = mean(norms), σ² = mean((norms − μ)²)
    then:    z = (g − μ) / (σ + 1e-6)
             if z > z_t:  g* = μ + z_t·σ / (z / z_t)  (= μ + z_t²·σ/z),  g ← g · g*/‖g‖
             μ ← α·μ + (1 − α)·g_eff;  σ² ← α·σ² + (1 − α)·(g_eff − μ)²   (μ: the new mean)
             with g_eff = g* if clipped else g (the EMA sees the clipped norm)

threshold = μ + z_t·(σ + 1e-6), the norm above which this step clips (inf during warm-up).
As in the paper, no fixed max-norm is combined with it (the reference's `max_grad_norm`). We
rescale to exactly g* (the reference divides by g + 1e-6). Clipping again from the same state
changes nothing: g* gives z = z_t²·σ / (z·(σ + 1e-6)) < z_t.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradexp._tf import tf
from gradexp.clipping.common import (
    INF,
    Clipper,
    clip_stats,
    global_norm,
    method,
    rescale,
    state_variable,
)

ZCLIP_EPS = 1e-6  # the ZClip reference's eps in z = (g − μ) / (σ + eps)


@dataclass
class ZClipState:
    """ZClip's statistics: warm-up norms, how many finite norms were seen, EMA mean and variance."""

    warmup_norms: tf.Variable
    seen: tf.Variable  # int64
    mean: tf.Variable
    var: tf.Variable

    @classmethod
    def create(cls, warmup_steps: int) -> ZClipState:
        def variable(value, name):
            return state_variable(value, f"zclip/{name}")

        return cls(variable(tf.zeros([warmup_steps]), "warmup_norms"),
                   variable(tf.constant(0, tf.int64), "seen"),
                   variable(0.0, "mean"), variable(0.0, "var"))

    @property
    def variables(self) -> list[tf.Variable]:
        return [self.warmup_norms, self.seen, self.mean, self.var]


def zclip(grads: list, state: ZClipState, alpha: float, z_threshold: float) -> tuple[list, dict]:
    """ZClip (the module docstring) with EMA factor α = `alpha` and z_t = `z_threshold`.
    threshold = μ + z_t·(σ + 1e-6), inf during warm-up."""
    norm = global_norm(grads)
    finite = tf.math.is_finite(norm)
    warmup_steps = state.warmup_norms.shape[0]
    ready = state.seen >= warmup_steps  # statistics initialised
    mean, var = state.mean.read_value(), state.var.read_value()
    std = tf.sqrt(var)
    z = (norm - mean) / (std + ZCLIP_EPS)
    clipped = finite & ready & (z > z_threshold)
    target = mean + (z_threshold * std) / (z / z_threshold)
    effective = tf.where(clipped, target, norm)
    threshold = tf.where(ready, mean + z_threshold * (std + ZCLIP_EPS), INF)
    _zclip_record(state, norm, effective, finite, alpha)
    out = rescale(grads, tf.where(clipped, target / norm, 1.0))
    return out, clip_stats(norm, out, threshold, clipped)


def _zclip_record(state: ZClipState, norm, effective, keep, alpha: float) -> None:
    """Advance the statistics by one norm (if `keep`): collect it during warm-up (initialising μ,
    σ² from the collected norms on the last warm-up step), else update the EMAs with `effective`."""
    warmup_steps = state.warmup_norms.shape[0]
    seen, mean, var = state.seen.read_value(), state.mean.read_value(), state.var.read_value()
    collecting = keep & (seen < warmup_steps)
    norms = tf.where(collecting & (tf.range(warmup_steps, dtype=tf.int64) == seen), norm,
                     state.warmup_norms)
    completes = collecting & (seen + 1 == warmup_steps)
    warm_mean = tf.reduce_mean(norms)
    warm_var = tf.reduce_mean(tf.square(norms - warm_mean))
    updating = keep & (seen >= warmup_steps)
    ema_mean = alpha * mean + (1 - alpha) * effective
    ema_var = alpha * var + (1 - alpha) * tf.square(effective - ema_mean)
    state.mean.assign(tf.where(completes, warm_mean, tf.where(updating, ema_mean, mean)))
    state.var.assign(tf.where(completes, warm_var, tf.where(updating, ema_var, var)))
    state.warmup_norms.assign(norms)
    state.seen.assign_add(tf.cast(keep, tf.int64))


@method("zclip")
def _zclip(c, params, output_params) -> Clipper:
    state = ZClipState.create(int(c.warmup_steps))
    alpha, z_threshold = float(c.alpha), float(c.z_threshold)
    return Clipper(c.name, lambda grads, params: zclip(grads, state, alpha, z_threshold),
                   state.variables)
