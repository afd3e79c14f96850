"""What every clipping method shares: the METHODS registry and its decorators, state variables,
the global norm, rescaling, the stats every method returns, and the `Clipper` the trainer calls.

A method module registers itself with @method(name) on a factory (its config node, the
parameters, the output layer's parameters) -> Clipper, or @stateless(name, *keys) on
f(grads, *settings) whose settings are the config's `keys`. make_clipper looks the name up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from gradexp._tf import tf
from gradexp.config import Registry

INF = float("inf")

# Each method under its name in conf/clipping/, each in its own module of gradexp/clipping/.
METHODS = Registry("clipping", "method", "gradexp/clipping/")
method = METHODS.add


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


def stateless(name: str, *keys: str):
    def register(clip: Callable) -> Callable:
        @method(name)
        def make(c, params, output_params) -> Clipper:
            settings = [None if c[key] is None else float(c[key]) for key in keys]
            return Clipper(c.name, lambda grads, params: clip(grads, *settings))

        return clip

    return register


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


def clip_stats(norm_before, grads_out, threshold, clipped) -> dict:
    """The stats every method returns (see the package docstring), as float32 scalars."""
    return {"norm_before": norm_before,
            "norm_after": global_norm(grads_out),
            "threshold": tf.cast(threshold, tf.float32),
            "clipped": tf.cast(clipped, tf.float32)}


def any_of(flags: list) -> tf.Tensor:
    """True if any of a list of boolean scalars is."""
    return tf.reduce_any(tf.stack(flags))


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
