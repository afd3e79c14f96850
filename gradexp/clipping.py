"""Parameter-gradient clipping: what happens between `tape.gradient` and `optimizer.apply`.

The trainer makes one clipper per run, outside its compiled step, and calls it inside:

    clipper = make_clipper(cfg.clipping, params, output_params=head.trainable_variables)
    ...
    grads = tape.gradient(loss, params)
    grads, stats = clipper(grads, params)
    optimizer.apply(grads, params)

Every method returns `(clipped_grads, stats)`, `stats` a dict of float32 scalars:

    norm_before  ‖g‖ = sqrt(Σ_tensors Σ_elements g²), the global L2 norm of the gradients in
    norm_after   the same norm of the gradients out
    threshold    the bound in force this step (each method says which)
    clipped      1.0 if the method changed a gradient this step, else 0.0

Non-finite gradients stay visible: when ‖g‖ is inf or NaN, every method returns the gradients
unchanged (Keras would turn them into NaN, or clip ±inf to the bound) and the adaptive methods leave
their state alone, so that one overflow does not poison their statistics for the rest of the run.
(A norm that overflows float32 while every element is finite, ≳1e19 per element, counts as
non-finite too.)

Activation clipping (gradexp/layers.py) is another thing: it clips dy, elementwise, where the
backward pass crosses a chosen position in the model, so everything upstream is computed from the
clipped signal. Parameter clipping acts once backprop is over, on the parameters' gradients.

Distribution: nothing here calls a tf.distribute API. Under a strategy, make the clipper inside
`strategy.scope()` (its state variables are then mirrored) and call it in cross-replica context on
the all-reduced gradients. Keras 3's own clipvalue/clipnorm/global_clipnorm act inside
`optimizer.apply` before its all-reduce, i.e. on each replica's gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradexp._tf import tf
from gradexp.config import Registry

INF = float("inf")
AGC_MIN_GRAD_NORM = 1e-6  # nfnets: floor on ‖G_unit‖ in the rescale, "just in case"
ZCLIP_EPS = 1e-6  # the ZClip reference's eps in z = (g − μ) / (σ + eps)


# Each method under its name in conf/clipping/: @method(name) on a factory (its config node, the
# parameters, the output layer's parameters) -> Clipper, or @stateless(name, *keys) on f(grads,
# *settings) whose settings are the config's `keys`. make_clipper looks the name up.
METHODS = Registry("clipping", "method", "gradexp/clipping.py")
method = METHODS.add


def stateless(name: str, *keys: str):
    def register(clip: Callable) -> Callable:
        @method(name)
        def make(c, params, output_params) -> Clipper:
            settings = [float(c[key]) for key in keys]
            return Clipper(c.name, lambda grads, params: clip(grads, *settings))

        return clip

    return register


# --------------------------------------------------------------------------- shared pieces
def state_variable(value, name: str) -> tf.Variable:
    """A clipping method's state. Under a distribution strategy every replica computes the same
    update (it clips the summed gradient), so the first replica's write is kept."""
    return tf.Variable(value, trainable=False, name=name,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


def global_norm(grads: list) -> tf.Tensor:
    """‖g‖ = sqrt(Σ_i Σ g_i²) in float32, summed as Keras 3 sums it: per tensor, then over them."""
    squares = [tf.reduce_sum(tf.square(tf.cast(g, tf.float32))) for g in grads]
    return tf.sqrt(tf.reduce_sum(tf.stack(squares)))


def rescale(grads: list, scale: tf.Tensor) -> list:
    """g ← g · scale for every tensor (a scale of exactly 1 leaves g bit-for-bit unchanged)."""
    return [g * tf.cast(scale, g.dtype) for g in grads]


def _stats(norm_before, grads_out, threshold, clipped) -> dict:
    return {"norm_before": norm_before,
            "norm_after": global_norm(grads_out),
            "threshold": tf.cast(threshold, tf.float32),
            "clipped": tf.cast(clipped, tf.float32)}


def _any(flags: list) -> tf.Tensor:
    return tf.reduce_any(tf.stack(flags))


# --------------------------------------------------------------------------- stateless
@stateless("none")
def no_clipping(grads: list) -> tuple[list, dict]:
    """g ← g. threshold = inf."""
    norm = global_norm(grads)
    return list(grads), _stats(norm, grads, INF, False)


@stateless("value", "max_value")
def clip_by_value(grads: list, max_value: float) -> tuple[list, dict]:
    """g ← clip(g, −v, v), elementwise (Keras `clipvalue`, which calls tf.clip_by_value).

    threshold = v.
    """
    norm = global_norm(grads)
    finite = tf.math.is_finite(norm)
    out = [tf.where(finite, tf.clip_by_value(g, -max_value, max_value), g) for g in grads]
    clipped = finite & _any([tf.reduce_any(tf.abs(g) > max_value) for g in grads])
    return out, _stats(norm, out, max_value, clipped)


@stateless("norm", "max_norm")
def clip_by_norm(grads: list, max_norm: float) -> tuple[list, dict]:
    """Each tensor on its own: g_i ← g_i · c / ‖g_i‖ where ‖g_i‖ > c (Keras `clipnorm`).

    Keras 3 calls tf.clip_by_norm, (g_i · c) / max(‖g_i‖, c), for every tensor; we use the same
    expression where it clips (bit-for-bit Keras' result) and leave g_i alone elsewhere (Keras'
    (g·c)/c may move g by a rounding). threshold = c; the global norm after is ≤ c·sqrt(#tensors).
    Computed in float32 and cast back to g's dtype, like the global norm.
    """
    norm = global_norm(grads)
    finite = tf.math.is_finite(norm)
    out, over = [], []
    for g in grads:
        g32 = tf.cast(g, tf.float32)  # a float16 g² overflows from |g| ≈ 256 (a no-op for float32)
        tensor_norm = tf.sqrt(tf.reduce_sum(g32 * g32, axis=None, keepdims=True))
        too_long = finite & (tensor_norm > max_norm)
        out.append(tf.where(too_long, tf.cast(g32 * max_norm / tensor_norm, g.dtype), g))
        over.append(tf.reduce_any(too_long))
    return out, _stats(norm, out, max_norm, _any(over))


@stateless("global_norm", "max_norm")
def clip_by_global_norm(grads: list, max_norm: float) -> tuple[list, dict]:
    """All tensors together: g ← g · c / ‖g‖ where ‖g‖ > c (Keras `global_clipnorm`; Pascanu,
    Mikolov & Bengio 2013, "On the difficulty of training recurrent neural networks").

    The factor is computed as Keras 3 computes it, c · (1/‖g‖), so a clipped step is bit-for-bit
    Keras'; below the bound g is left exactly as it is (Keras multiplies by c · (1/c), which may
    differ from 1 by a rounding). threshold = c.
    """
    norm = global_norm(grads)
    clipped = tf.math.is_finite(norm) & (norm > max_norm)
    out = rescale(grads, tf.where(clipped, max_norm * (1.0 / norm), 1.0))
    return out, _stats(norm, out, max_norm, clipped)


def unitwise_norm(x) -> tf.Tensor:
    """‖x‖ per unit: over every axis but the last for a Keras kernel (…, in, out), i.e. one norm
    per output unit of a Dense kernel [in, out] or per filter of a Conv kernel [h, w, in, out];
    over the whole tensor for a scalar or a vector (biases, gains), which nfnets and timm both
    treat as one unit. This is nfnets' `unitwise_norm` (HWIO layout) for 1-, 2- and 4-D tensors
    and timm's (PyTorch's out-first layout) transposed. Where nfnets differs we go by rank: it
    squeezes size-1 axes first (a [1, out] kernel becomes one vector) and reduces only axis 0 of
    a 3-D tensor; we take a Conv1D kernel [w, in, out] per filter, like the others.
    """
    x = tf.cast(x, tf.float32)
    if x.shape.rank <= 1:
        return tf.sqrt(tf.reduce_sum(tf.square(x)))
    return tf.sqrt(tf.reduce_sum(tf.square(x), axis=list(range(x.shape.rank - 1)), keepdims=True))


def adaptive_clip(grads: list, params: list, factor: float, eps: float,
                  skip: list[bool]) -> tuple[list, dict]:
    """Unit-wise adaptive gradient clipping, AGC (Brock, De, Smith & Simonyan 2021,
    "High-Performance Large-Scale Image Recognition Without Normalization"; deepmind-research
    nfnets/optim.py SGD_AGC, timm/utils/agc.py adaptive_clip_grad). For every unit of every
    parameter W with gradient G:

        max_norm = λ · max(‖W_unit‖, eps)
        G_unit ← G_unit · max_norm / max(‖G_unit‖, 1e-6)    where ‖G_unit‖ > max_norm

    Parameters flagged in `skip` (the output layer, which the paper does not clip) pass unchanged.
    threshold = λ (the bounds themselves differ per unit).
    """
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
    clipped = _any(over) if over else tf.constant(False)
    return out, _stats(norm, out, factor, clipped)


@method("agc")
def _agc(c, params, output_params) -> Clipper:
    factor, eps = float(c.factor), float(c.eps)
    excluded = output_paths(params, output_params) if c.exclude_output else set()
    if c.exclude_output and not excluded:
        raise ValueError("clipping=agc with exclude_output=true: pass the output layer's "
                         "parameters as output_params")
    return Clipper(c.name, lambda grads, params: adaptive_clip(
        grads, params, factor, eps, [variable_path(v) in excluded for v in params]))


# --------------------------------------------------------------------------- AutoClip
@dataclass
class NormHistory:
    """The last `size` finite global norms, twice: `arrivals` in arrival order (the next one goes
    to slot count mod size) and `ascending` the same values sorted, +inf in slots not yet filled.
    Keeping them sorted costs a few O(size) vector operations per step, less than a sort: with
    10 000 norms, about 0.7 ms against 1.1 ms per step in a tf.function on 2 CPU cores, and
    0.16 ms against 4 ms under XLA."""

    arrivals: tf.Variable
    ascending: tf.Variable
    count: tf.Variable  # norms recorded so far (int64)

    @classmethod
    def create(cls, size: int) -> NormHistory:
        def variable(value, name):
            return state_variable(value, f"autoclip/{name}")

        return cls(variable(tf.fill([size], INF), "arrivals"),
                   variable(tf.fill([size], INF), "ascending"),
                   variable(tf.constant(0, tf.int64), "count"))

    @property
    def variables(self) -> list[tf.Variable]:
        return [self.arrivals, self.ascending, self.count]


def record(history: NormHistory, norm: tf.Tensor, keep: tf.Tensor) -> None:
    """Add `norm` to the history if `keep`, evicting the oldest norm once the history is full."""
    size = history.ascending.shape[0]
    i = tf.range(size, dtype=tf.int64)
    slot = history.count % size
    evicted = tf.where(history.count >= size, tf.gather(history.arrivals, slot), INF)
    old = history.ascending.read_value()

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
    history.ascending.assign(tf.where(keep, new, old))
    history.arrivals.assign(tf.where(keep & (i == slot), norm, history.arrivals))
    history.count.assign_add(tf.cast(keep, tf.int64))


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


def autoclip(grads: list, history: NormHistory, p: float) -> tuple[list, dict]:
    """AutoClip (Seetharaman, Wichern, Pardo & Le Roux 2020, "AutoClip: Adaptive Gradient Clipping
    for Source Separation Networks"; github.com/pseeth/autoclip):

        h ← h ∪ {‖g‖}              (appended before the percentile, as in the paper's code)
        T = percentile_p(h)
        g ← g · T / ‖g‖            where ‖g‖ > T

    h keeps the last `size` norms. threshold = T. The paper's code rescales by T / (‖g‖ + 1e-6)
    (torch's clip_grad_norm_); we rescale to exactly T. Not idempotent: clipping the same gradient
    again from the same state records T instead of ‖g‖, which may lower the percentile below T.
    """
    norm = global_norm(grads)
    finite = tf.math.is_finite(norm)
    record(history, norm, finite)
    threshold = percentile(history, p)
    clipped = finite & (norm > threshold)
    out = rescale(grads, tf.where(clipped, threshold / norm, 1.0))
    return out, _stats(norm, out, threshold, clipped)


@method("autoclip")
def _autoclip(c, params, output_params) -> Clipper:
    history, clip_percentile = NormHistory.create(int(c.history)), float(c.percentile)
    return Clipper(c.name, lambda grads, params: autoclip(grads, history, clip_percentile),
                   history.variables)


# --------------------------------------------------------------------------- ZClip
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
    return out, _stats(norm, out, threshold, clipped)


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


# --------------------------------------------------------------------------- the trainer's API
@dataclass(eq=False)  # hashable by identity, like a function
class Clipper:
    """One run's parameter-gradient clipping: `grads, stats = clipper(grads, params)`.

    `state_variables` is what a checkpoint must save (empty for the stateless methods). None
    gradients pass through as None; IndexedSlices are made dense.
    """

    name: str
    clip: Callable[[list, list], tuple[list, dict]]
    state_variables: list[tf.Variable] = field(default_factory=list)

    def __call__(self, grads, params) -> tuple[list, dict]:
        grads, params = list(grads), list(params)
        if len(grads) != len(params):
            raise ValueError(f"{len(grads)} gradients for {len(params)} parameters")
        present = [i for i, g in enumerate(grads) if g is not None]
        clipped, stats = self.clip([tf.convert_to_tensor(grads[i]) for i in present],
                                   [params[i] for i in present])
        for i, g in zip(present, clipped, strict=True):
            grads[i] = g
        return grads, stats


def make_clipper(cfg: Any, params: list, output_params: Iterable | None = None) -> Clipper:
    """The clipper of a `clipping` config node; its state variables are created here.

    Call it outside the compiled step (inside `strategy.scope()` under a distribution strategy).
    `output_params`: the output layer's parameters, as variables, variable paths, or one boolean
    per entry of `params`; AGC leaves them unclipped when `exclude_output` is true.
    """
    return METHODS[cfg.name](cfg, params, output_params)


def variable_path(v) -> str:
    """A Keras 3 variable's path (`logits/kernel`), or a tf.Variable's name."""
    return getattr(v, "path", None) or v.name


def output_paths(params: list, output_params: Iterable | None) -> set[str]:
    """The output layer's parameter paths, from variables, paths or one boolean per parameter."""
    items = list(output_params or [])
    known = [variable_path(v) for v in params]
    if items and all(isinstance(x, (bool, np.bool_)) for x in items):
        if len(items) != len(params):
            raise ValueError(f"output_params: {len(items)} booleans for {len(params)} parameters")
        return {path for path, is_output in zip(known, items, strict=True) if is_output}
    paths = {x if isinstance(x, str) else variable_path(x) for x in items}
    unknown = sorted(paths - set(known))
    if unknown:
        raise ValueError(f"output_params: {unknown[0]} is not among the parameters")
    return paths
