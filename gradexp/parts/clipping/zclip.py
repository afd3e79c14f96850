"""ZClip (Kumar, Owen, Roy Chowdhury & Güra 2025, "ZClip: Adaptive Spike Mitigation for LLM
Pre-Training"; github.com/bluorion-com/ZClip, zclip/zclip.py, class ZClip). With g = ‖g‖:

    warm-up: the first W finite norms are collected, and clipped only by the cap c (below);
             the W-th sets μ = mean(norms), σ² = mean((norms − μ)²)
    then:    a spike, and the norm g* it is clipped to, by `mode` and `clip_option`:
               zscore, adaptive_scaling (the paper's "reciprocal" clipping, the default):
                 z = (g − μ) / (σ + 1e-6);  spike if z > z_t;  g* = f · (μ + z_t·σ / (z / z_t))
               zscore, mean:    spike if z > z_t;          g* = μ
               percentile:      spike if g > μ + z_t·σ;    g* = μ + z_t·σ
             g ← g · min(g*, c)/g on a spike, else g ← g · c/g if g > c
             μ ← α·μ + (1 − α)·g_eff;  σ² ← α·σ² + (1 − α)·(g_eff − μ)²   (μ: the new mean)
             with g_eff = g* on a spike, else g (the EMA sees the clipped norm, never the cap)

f = `clip_factor` (the reference multiplies the whole of μ + z_t²·σ/z by it, although its
docstring says the z_t·σ term); c = `max_grad_norm`, a fixed cap on every step, warm-up
included (null: none). The config refuses an option the mode ignores. The reference's
`skip_update_on_spike` (leave μ, σ² alone on a spike) is not taken.

threshold = μ + z_t·(σ + 1e-6) (percentile: μ + z_t·σ), the norm above which a step is a spike,
inf during warm-up; with a cap, the smaller of it and c. We rescale to exactly min(g*, c) (the
reference divides by g + 1e-6). clip_factor is at most 1 (the config's check), so g* < g on a
spike. Clipping again from the same state changes nothing (zscore, adaptive_scaling, f = 1): g*
gives z = z_t²·σ / (z·(σ + 1e-6)) < z_t.
"""

from __future__ import annotations

from typing import NamedTuple

from gradexp._tf import tf
from gradexp.config.clipping import ZClipConfig
from gradexp.parts.clipping.common import INF, Method, clip_stats, global_norm, method, rescale

ZCLIP_EPS = 1e-6  # the ZClip reference's eps in z = (g − μ) / (σ + eps)
ZSCORE, PERCENTILE = "zscore", "percentile"  # modes
ADAPTIVE_SCALING, MEAN = "adaptive_scaling", "mean"  # clip_options of mode zscore
# What a config node without the keys added later (a run's recorded config from before) means:
# the schema's defaults, the behaviour from before them
OPTION_DEFAULTS = {key: getattr(ZClipConfig, key)
                   for key in ("mode", "clip_option", "clip_factor", "max_grad_norm")}


class ZClipState(NamedTuple):
    """ZClip's statistics: warm-up norms, how many finite norms were seen, EMA mean and variance."""

    warmup_norms: tf.Tensor
    seen: tf.Tensor  # int64
    mean: tf.Tensor
    var: tf.Tensor

    @classmethod
    def create(cls, warmup_steps: int) -> ZClipState:
        return cls(tf.zeros([warmup_steps]), tf.constant(0, tf.int64), tf.constant(0.0),
                   tf.constant(0.0))


def zclip(grads: list, state: ZClipState, alpha: float, z_threshold: float, *,
          mode: str = ZSCORE, clip_option: str = ADAPTIVE_SCALING, clip_factor: float = 1.0,
          max_grad_norm: float | None = None) -> tuple[list, ZClipState, dict]:
    """ZClip (the module docstring) with EMA factor α = `alpha`, z_t = `z_threshold`, and the
    reference's options. threshold = the spike boundary (inf during warm-up), capped by
    `max_grad_norm`."""
    norm = global_norm(grads)
    finite = tf.math.is_finite(norm)
    warmup_steps = state.warmup_norms.shape[0]
    ready = state.seen >= warmup_steps  # statistics initialised
    mean, var = state.mean, state.var
    std = tf.sqrt(var)
    if mode == PERCENTILE:
        boundary = mean + z_threshold * std
        detected = norm > boundary
        target = boundary
    else:
        boundary = mean + z_threshold * (std + ZCLIP_EPS)
        z = (norm - mean) / (std + ZCLIP_EPS)
        detected = z > z_threshold
        if clip_option == MEAN:
            target = mean
        else:
            target = (mean + (z_threshold * std) / (z / z_threshold)) * clip_factor
    spike = finite & ready & detected
    effective = tf.where(spike, target, norm)  # what the statistics see
    threshold = tf.where(ready, boundary, INF)
    bound, clipped = effective, spike
    if max_grad_norm is not None:
        bound = tf.minimum(effective, max_grad_norm)
        clipped = spike | (finite & (norm > max_grad_norm))
        threshold = tf.minimum(threshold, max_grad_norm)
    out = rescale(grads, tf.where(clipped, bound / norm, 1.0))
    state = _zclip_record(state, norm, effective, finite, alpha)
    return out, state, clip_stats(norm, out, threshold, clipped)


def _zclip_record(state: ZClipState, norm, effective, keep, alpha: float) -> ZClipState:
    """The statistics advanced by one norm (if `keep`): collected during warm-up (μ, σ² set from
    the collected norms on the last warm-up step), else the EMAs updated with `effective`."""
    warmup_steps = state.warmup_norms.shape[0]
    seen, mean, var = state.seen, state.mean, state.var
    collecting = keep & (seen < warmup_steps)
    norms = tf.where(collecting & (tf.range(warmup_steps, dtype=tf.int64) == seen), norm,
                     state.warmup_norms)
    completes = collecting & (seen + 1 == warmup_steps)
    warm_mean = tf.reduce_mean(norms)
    warm_var = tf.reduce_mean(tf.square(norms - warm_mean))
    updating = keep & (seen >= warmup_steps)
    ema_mean = alpha * mean + (1 - alpha) * effective
    ema_var = alpha * var + (1 - alpha) * tf.square(effective - ema_mean)
    return ZClipState(norms, seen + tf.cast(keep, tf.int64),
                      tf.where(completes, warm_mean, tf.where(updating, ema_mean, mean)),
                      tf.where(completes, warm_var, tf.where(updating, ema_var, var)))


@method("zclip")
def _zclip(c, params, output_params) -> Method:
    warmup_steps = int(c.warmup_steps)
    alpha, z_threshold = float(c.alpha), float(c.z_threshold)
    options = {key: c.get(key, default) for key, default in OPTION_DEFAULTS.items()}
    cap = options["max_grad_norm"]
    options.update(mode=str(options["mode"]), clip_option=str(options["clip_option"]),
                   clip_factor=float(options["clip_factor"]),
                   max_grad_norm=None if cap is None else float(cap))
    return Method(c.name, lambda: ZClipState.create(warmup_steps),
                  lambda grads, state, params: zclip(grads, state, alpha, z_threshold, **options))
