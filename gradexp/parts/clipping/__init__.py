"""Parameter-gradient clipping: what happens between `tape.gradient` and `optimizer.apply`.

A method is two pure functions, as optax's gradient transformations are: the trainer makes it
once per run and carries its state from step to step as a value (gradexp/training/step.py):

    method = make_clipper(cfg.clipping, params, output_params=head.trainable_variables)
    state = method.init(params)                 # a NamedTuple of tensors; empty if stateless
    grads, state, stats = method.update(tape.gradient(loss, params), state, params)

`stats` is a dict of float32 scalars:

    norm_before  ‖g‖ = sqrt(Σ_tensors Σ_elements g²), the global L2 norm of the gradients in
    norm_after   the same norm of the gradients out
    threshold    the bound in force this step (each method says which)
    clipped      1.0 if the method changed a gradient this step, else 0.0

Non-finite gradients stay visible: when ‖g‖ is inf or NaN (also a norm that overflows float32
while every element is finite), every method returns the gradients unchanged (Keras would make
them NaN, or clip ±inf to the bound) and the adaptive methods leave their state alone.

Under a distribution strategy a method takes the all-reduced gradients (Keras's clipnorm acts
on each replica's). Each module but common.py is one family, its formulas and references in its
docstring, its methods registered under their names in conf/clipping/ (each module imported).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from typing import Any

from gradexp.parts.clipping.common import METHODS, Method

__all__ = ["METHODS", "Method", "make_clipper"]


def make_clipper(cfg: Any, params: list, output_params: Iterable | None = None) -> Method:
    """The method of a `clipping` config node, made for `params` (the run's trainable variables).

    `output_params`: the output layer's parameters, as variables, variable paths, or one boolean
    per entry of `params`; AGC leaves them unclipped when `exclude_output` is true.
    """
    return METHODS[cfg.name](cfg, params, output_params)


for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
del _module
