"""The `clipping` group's schemas (conf/clipping/): parameter-gradient clipping, between
tape.gradient and optimizer.apply. Each method's keys and checks; the methods themselves are in
gradexp/clipping/, registered under the same names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from omegaconf import MISSING

from gradexp.config.base import Choice, Registry, at_least, check_positive, finite, need


@dataclass
class ClippingConfig(Choice):
    OPTIONS: ClassVar[Registry] = Registry("clipping", "schema", "gradexp/config/clipping.py")


@dataclass
class NoClippingConfig(ClippingConfig):
    """The gradients as they are (the statistics are still measured)."""

    name: str = "none"


@dataclass
class ValueClippingConfig(ClippingConfig):
    """Each element clipped to [-max_value, max_value] (Keras `clipvalue`)."""

    name: str = "value"
    max_value: float = MISSING

    def check(self) -> None:
        check_positive("max_value", self.max_value)


@dataclass
class NormClippingConfig(ClippingConfig):
    """Each gradient tensor rescaled to norm <= max_norm (Keras `clipnorm`)."""

    name: str = "norm"
    max_norm: float = MISSING

    def check(self) -> None:
        check_positive("max_norm", self.max_norm)


@dataclass
class GlobalNormClippingConfig(ClippingConfig):
    """All gradients rescaled together to global norm <= max_norm (Keras `global_clipnorm`);
    max_norm null never clips: the unclipped baseline inside a sweep of the threshold."""

    name: str = "global_norm"
    max_norm: float | None = MISSING

    def check(self) -> None:
        need(self.max_norm is None or (finite(self.max_norm) and self.max_norm > 0), "max_norm",
             self.max_norm, "must be a positive number, or null (never clips)")


@dataclass
class AGCConfig(ClippingConfig):
    """Unit-wise (Brock et al. 2021): ||G_unit|| <= factor * max(||W_unit||, eps), per unit."""

    name: str = "agc"
    factor: float = MISSING
    eps: float = MISSING
    exclude_output: bool = MISSING  # the output layer is not clipped (as in the paper)

    def check(self) -> None:
        check_positive("factor", self.factor)
        check_positive("eps", self.eps)


@dataclass
class AutoClipConfig(ClippingConfig):
    """Global norm clipped at the `percentile`-th percentile of the norms seen so far."""

    name: str = "autoclip"
    percentile: float = MISSING
    history: int = MISSING  # the last `history` norms are kept

    def check(self) -> None:
        need(0 <= self.percentile <= 100, "percentile", self.percentile,
             "must be a number in [0, 100]")
        at_least(self, 1, "history")


@dataclass
class ZClipConfig(ClippingConfig):
    """Global norm clipped when its z-score against an EMA of past norms exceeds z_threshold."""

    name: str = "zclip"
    alpha: float = MISSING  # EMA factor of the mean and variance of the norm
    z_threshold: float = MISSING
    warmup_steps: int = MISSING  # norms collected to initialise the statistics; no clipping

    def check(self) -> None:
        need(0 < self.alpha < 1, "alpha", self.alpha, "must be in (0, 1)")
        check_positive("z_threshold", self.z_threshold)
        at_least(self, 1, "warmup_steps")
