"""The `optimizer` group's schemas (conf/optimizer/): each optimizer's keys and checks. The
factories are in gradexp/parts/optimizers.py, registered under the same names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from gradexp.config.base import Choice, Registry, any_keys, finite, need


@dataclass
class OptimizerConfig(Choice):
    OPTIONS: ClassVar[Registry] = Registry("optimizer", "schema", "gradexp/config/optimizer.py")


@dataclass
class SGDConfig(OptimizerConfig):
    name: str = "sgd"
    learning_rate: float = 0.001
    momentum: float = 0.9  # Keras's `momentum`: v = momentum·v − learning_rate·g, θ += v
    nesterov: bool = False  # Keras's `nesterov`: θ += momentum·v − learning_rate·g instead

    def check(self) -> None:
        check_learning_rate(self.learning_rate)
        need(0 <= self.momentum < 1, "momentum", self.momentum, "must be in [0, 1)")


@dataclass
class AdamConfig(OptimizerConfig):
    name: str = "adam"
    learning_rate: float = 0.0001  # Keras's `learning_rate`, constant through the run
    beta_1: float = 0.9  # Keras's `beta_1`: decay of m, the moving average of g
    beta_2: float = 0.999  # Keras's `beta_2`: decay of v, the moving average of g²
    epsilon: float = 1e-07  # Keras's `epsilon`, added to √v in the step's denominator

    def check(self) -> None:
        check_learning_rate(self.learning_rate)
        for key in ("beta_1", "beta_2"):
            need(0 <= getattr(self, key) < 1, key, getattr(self, key), "must be in [0, 1)")
        need(self.epsilon > 0, "epsilon", self.epsilon, "must be a positive number")


@dataclass
class AdamWConfig(OptimizerConfig):
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019): each step also shrinks every
    weight by learning_rate · weight_decay · θ."""

    name: str = "adamw"
    learning_rate: float = 0.001
    weight_decay: float = 0.004  # Keras's `weight_decay`: θ −= learning_rate·weight_decay·θ
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-07

    def check(self) -> None:
        AdamConfig.check(self)
        need(finite(self.weight_decay) and self.weight_decay >= 0, "weight_decay",
             self.weight_decay, "must be a number >= 0")


@dataclass
class KerasOptimizerConfig(OptimizerConfig):
    """Any Keras optimizer: `class_name` one of keras.optimizers' (`Lion`, `Adafactor`, ...) or a
    dotted path to an optimizer class of one's own, built with `learning_rate` and `kwargs`."""

    name: str = "keras"
    class_name: str = MISSING
    learning_rate: float = 0.001
    kwargs: dict[str, Any] = field(default_factory=any_keys)

    def check(self) -> None:
        check_learning_rate(self.learning_rate)
        need(isinstance(self.class_name, str) and bool(self.class_name.strip()), "class_name",
             self.class_name, "must name a Keras optimizer (e.g. Lion) or a dotted path")


def check_learning_rate(value: float) -> None:
    need(finite(value) and value > 0, "learning_rate", value, "must be a positive number")
