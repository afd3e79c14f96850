"""Unit-wise adaptive gradient clipping, AGC (Brock, De, Smith & Simonyan 2021, "High-Performance
Large-Scale Image Recognition Without Normalization"; deepmind-research nfnets/optim.py SGD_AGC,
timm/utils/agc.py adaptive_clip_grad). For every unit of every parameter W with gradient G:

    max_norm = λ · max(‖W_unit‖, eps)
    G_unit ← G_unit · max_norm / max(‖G_unit‖, 1e-6)    where ‖G_unit‖ > max_norm

A unit is an output unit of a kernel (the norm over every axis but the last) or a whole bias or
gain; see `unitwise_norm`. The output layer, which the paper does not clip, passes unchanged
when `exclude_output` is true. threshold = λ (the bounds themselves differ per unit).
"""

from __future__ import annotations

from gradexp._tf import tf
from gradexp.parts.clipping.common import (
    Method,
    NoState,
    any_of,
    clip_stats,
    global_norm,
    method,
    output_paths,
    variable_path,
)

AGC_MIN_GRAD_NORM = 1e-6  # nfnets: floor on ‖G_unit‖ in the rescale, "just in case"


def unitwise_norm(x) -> tf.Tensor:
    """‖x‖ per unit: one norm per output unit of a Keras kernel (…, in, out), over every axis
    but the last (a Dense kernel's columns, a Conv kernel's filters); one over the whole of a
    scalar or vector (biases, gains). nfnets' `unitwise_norm` (HWIO) for 1-, 2- and 4-D tensors
    and timm's transposed; nfnets squeezes size-1 axes first and reduces only axis 0 of a 3-D
    tensor, where we go by rank (a Conv1D kernel [w, in, out] per filter)."""
    x = tf.cast(x, tf.float32)
    if x.shape.rank <= 1:
        return tf.sqrt(tf.reduce_sum(tf.square(x)))
    return tf.sqrt(tf.reduce_sum(tf.square(x), axis=list(range(x.shape.rank - 1)), keepdims=True))


def adaptive_clip(grads: list, params: list, factor: float, eps: float,
                  skip: list[bool]) -> tuple[list, dict]:
    """AGC (the module docstring) with λ = `factor`; parameters flagged in `skip` pass unchanged.
    threshold = λ."""
    norm = global_norm(grads)
    finite = tf.math.is_finite(norm)
    out, over = [], []
    for g, w, skipped in zip(grads, params, skip, strict=True):
        if skipped:
            out.append(g)
            continue
        max_norm = tf.maximum(unitwise_norm(w), eps) * factor
        grad_norm = unitwise_norm(g)
        trigger = finite & (grad_norm > max_norm)
        shrunk = g * tf.cast(max_norm / tf.maximum(grad_norm, AGC_MIN_GRAD_NORM), g.dtype)
        out.append(tf.where(trigger, shrunk, g))
        over.append(tf.reduce_any(trigger))
    clipped = any_of(over) if over else tf.constant(False)
    return out, clip_stats(norm, out, factor, clipped)


@method("agc")
def _agc(c, params, output_params) -> Method:
    factor, eps = float(c.factor), float(c.eps)
    excluded = output_paths(params, output_params) if c.exclude_output else set()
    if c.exclude_output and not excluded:
        raise ValueError("clipping=agc with exclude_output=true: pass the output layer's "
                         "parameters as output_params")

    def update(grads, state, params):
        out, stats = adaptive_clip(grads, params, factor, eps,
                                   [variable_path(v) in excluded for v in params])
        return out, state, stats

    return Method(c.name, NoState, update)
