"""What every clipping method shares: the METHODS registry, where a module registers
@method(name) on a factory (its config node, the parameters, the output layer's parameters) ->
Method, or @stateless(name, *keys); the `Method` the trainer calls; the global norm, rescaling,
and the stats every method returns."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from gradexp._tf import tf
from gradexp.config import Registry

INF = float("inf")

METHODS = Registry("clipping", "method", "gradexp/parts/clipping/")
method = METHODS.add


class NoState(NamedTuple):
    """The state of a method that keeps none."""


@dataclass(frozen=True, eq=False)  # hashable by identity, like a function
class Method:
    """One run's parameter-gradient clipping as two pure functions, optax's init and update
    (the package docstring). The state is a NamedTuple of tensors (NoState: stateless) that the
    step carries and a checkpoint saves field by field; `update` passes None gradients through
    and makes IndexedSlices dense."""

    name: str
    initial: Callable[[], NamedTuple]  # the state before the first step
    clip: Callable[[list, NamedTuple, list], tuple[list, NamedTuple, dict]]  # present grads only

    def init(self, params: list) -> NamedTuple:
        return self.initial()

    def update(self, grads, state: NamedTuple, params) -> tuple[list, NamedTuple, dict]:
        grads, params = list(grads), list(params)
        if len(grads) != len(params):
            raise ValueError(f"{len(grads)} gradients for {len(params)} parameters")
        present = [i for i, g in enumerate(grads) if g is not None]
        clipped, state, stats = self.clip([tf.convert_to_tensor(grads[i]) for i in present],
                                          state, [params[i] for i in present])
        for i, g in zip(present, clipped, strict=True):
            grads[i] = g
        return grads, state, stats


def stateless(name: str, *keys: str):
    """Register f(grads, *settings) -> (grads, stats) under `name`, its settings the config's
    `keys`."""
    def register(clip: Callable) -> Callable:
        @method(name)
        def make(c, params, output_params) -> Method:
            settings = [None if c[key] is None else float(c[key]) for key in keys]

            def update(grads, state, params):
                out, stats = clip(grads, *settings)
                return out, state, stats

            return Method(c.name, NoState, update)

        return clip

    return register


def global_norm(grads: list) -> tf.Tensor:
    """‖g‖ = sqrt(Σ_i Σ g_i²) in float32, summed as Keras 3 sums it: per tensor, then over them
    (a tensor of 2^16 elements or more by layers.total, on every core: in the last bits its sum
    may differ from Keras's)."""
    from gradexp.parts.layers import total

    squares = [total(tf.square(tf.cast(g, tf.float32))) for g in grads]
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


def variable_path(v: Any) -> str:
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
