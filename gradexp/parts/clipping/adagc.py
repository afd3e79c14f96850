"""AdaGC, per-tensor adaptive clipping (Wang, Li, Chen, Zeng, Yang, Yu, Ma & Shen 2025, "AdaGC:
Improving Training Stability for Large Language Model Pretraining", arXiv 2502.11034; the
authors' code: github.com/lishuai-97/AdaGC, megatron-gpt2.patch, megatron/optimizer/
clip_grads.py, class AdaGC). For every parameter tensor i, with g_i its gradient and t the step:

    warm-up, t ≤ T:  g ← g · min(1, λ_abs / ‖g‖)                      (global clipping, GlobalGC)
                     γ_i ← min(γ_i, ‖g_i‖)  of the clipped g_i         (the first: ‖g_i‖)
    then:            g_i ← g_i · min(1, λ_rel · γ_i / ‖g_i‖)          (γ_i of the step before)
                     γ_i ← β · γ_i + (1 − β) · ‖g_i‖  of the clipped g_i

λ_rel = `clip_ratio`, β = `beta`, T = `warmup_steps`, λ_abs = `warmup_max_norm` (null, an
extension: no clipping in the warm-up). As in the authors' code: the warm-up (`start_clip_steps`,
Megatron's `--clip-grad` as λ_abs), L2 norms of whole tensors, γ_i = 0 kept by a tensor whose
gradient was exactly zero in the warm-up (clipped to zero from then on), and a tensor first seen
after the warm-up (its gradient None until then) starting from its own norm, unclipped that
step. The code rescales by bound / (‖g_i‖ + 1e-6); we rescale to exactly the bound.

threshold = λ_abs during the warm-up (inf if null), then λ_rel·sqrt(Σ_i γ_i²): the global norm
of the per-tensor bounds, which the global norm after clipping never exceeds.
"""

from __future__ import annotations

from typing import NamedTuple

from gradexp._tf import tf
from gradexp.parts.clipping.common import (
    INF,
    Method,
    clip_stats,
    global_norm,
    method,
    variable_path,
)


class AdaGCState(NamedTuple):
    """γ_i per parameter tensor, in the order of the parameters the method was made for (+inf
    until its first finite step), and the number of finite steps seen."""

    gamma: tf.Tensor
    steps: tf.Tensor  # int64

    @classmethod
    def create(cls, tensors: int) -> AdaGCState:
        return cls(tf.fill([tensors], INF), tf.constant(0, tf.int64))


def tensor_norms(grads: list) -> tf.Tensor:
    """‖g_i‖ for every tensor, in float32, as a vector."""
    return tf.stack([tf.sqrt(tf.reduce_sum(tf.square(tf.cast(g, tf.float32)))) for g in grads])


def adagc(grads: list, slots: list[int], state: AdaGCState, clip_ratio: float, beta: float,
          warmup_max_norm: float | None, warmup_steps: int) -> tuple[list, AdaGCState, dict]:
    """AdaGC (the module docstring); `slots[k]` is the index in `state.gamma` of grads[k]'s
    tensor. threshold = λ_abs in the warm-up, λ_rel·‖γ‖ after it."""
    norm = global_norm(grads)
    finite = tf.math.is_finite(norm)
    norms = tensor_norms(grads)
    every_gamma = state.gamma
    gamma = tf.gather(every_gamma, slots)
    warming = state.steps < warmup_steps
    if warmup_max_norm is None:
        warm_over, warm_scale, warm_threshold = tf.constant(False), tf.constant(1.0), INF
    else:
        warm_over = norm > warmup_max_norm
        warm_scale = tf.where(warm_over, warmup_max_norm / norm, 1.0)
        warm_threshold = warmup_max_norm
    warm_gamma = tf.minimum(gamma, norms * warm_scale)  # +inf (not yet seen) gives the norm
    # After the warm-up: each tensor against its own γ_i (its own norm the first time it is seen).
    gamma = tf.where(tf.math.is_finite(gamma), gamma, norms)
    bound = clip_ratio * gamma
    over = norms > bound
    ema_gamma = beta * gamma + (1 - beta) * tf.where(over, bound, norms)
    scales = tf.where(warming, warm_scale, tf.where(over, bound / norms, 1.0))
    clipped = finite & tf.where(warming, warm_over, tf.reduce_any(over))
    threshold = tf.where(warming, warm_threshold, clip_ratio * tf.norm(gamma))
    updated = tf.tensor_scatter_nd_update(every_gamma, [[s] for s in slots],
                                          tf.where(warming, warm_gamma, ema_gamma))
    state = AdaGCState(tf.where(finite, updated, every_gamma),
                       state.steps + tf.cast(finite, tf.int64))
    scales = tf.where(finite, scales, 1.0)  # non-finite gradients pass unchanged
    out = [g * tf.cast(scales[k], g.dtype) for k, g in enumerate(grads)]
    return out, state, clip_stats(norm, out, threshold, clipped)


@method("adagc")
def _adagc(c, params, output_params) -> Method:
    paths = [variable_path(v) for v in params]
    if len(set(paths)) != len(paths):
        raise ValueError("clipping=adagc keeps one threshold per parameter: two parameters "
                         "have the same path")
    slot_of = {path: slot for slot, path in enumerate(paths)}
    cap = None if c.warmup_max_norm is None else float(c.warmup_max_norm)
    settings = (float(c.clip_ratio), float(c.beta), cap, int(c.warmup_steps))

    def update(grads, state, present):
        unknown = [variable_path(v) for v in present if variable_path(v) not in slot_of]
        if unknown:
            raise ValueError(f"clipping=adagc: {unknown[0]} is not among the parameters the "
                             "method was made for")
        return adagc(grads, [slot_of[variable_path(v)] for v in present], state, *settings)

    return Method(c.name, lambda: AdaGCState.create(len(paths)), update)
