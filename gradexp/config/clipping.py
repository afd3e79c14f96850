"""The `clipping` group's schemas (conf/clipping/): parameter-gradient clipping, between
tape.gradient and optimizer.apply. Each method's keys and checks; the methods themselves are in
gradexp/parts/clipping/, registered under the same names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from gradexp.config.base import (
    DOTTED_PATH,
    Choice,
    Registry,
    any_keys,
    at_least,
    check_positive,
    finite,
    need,
    one_of,
)

ZCLIP_MODES = ("zscore", "percentile")
ZCLIP_OPTIONS = ("adaptive_scaling", "mean")  # of mode zscore


@dataclass
class ClippingConfig(Choice):
    OPTIONS: ClassVar[Registry] = Registry("clipping", "schema", "gradexp/config/clipping.py")


@dataclass
class NoClippingConfig(ClippingConfig):
    """The gradients as they are (the statistics are still measured)."""

    name: str = "none"


@dataclass
class FunctionClippingConfig(ClippingConfig):
    """A method given by its code alone: `method`, a dotted path to
    `make(params, output_params, **kwargs) -> gradexp.parts.clipping.Method` (its init/update pair),
    called with `kwargs`; its settings are checked by that code, when the run starts."""

    name: str = "function"
    method: str = field(default=MISSING, metadata={"allowed": f"must be set to {DOTTED_PATH}"})
    kwargs: dict[str, Any] = field(default_factory=any_keys)


@dataclass
class ValueClippingConfig(ClippingConfig):
    """Each element clipped to [-max_value, max_value] (Keras `clipvalue`)."""

    name: str = "value"
    max_value: float = 0.5  # each element clipped to [-max_value, max_value] (Keras clipvalue)

    def check(self) -> None:
        check_positive("max_value", self.max_value)


@dataclass
class NormClippingConfig(ClippingConfig):
    """Each gradient tensor rescaled to norm <= max_norm (Keras `clipnorm`)."""

    name: str = "norm"
    max_norm: float = 20.0  # each gradient tensor rescaled to norm <= max_norm (Keras clipnorm)

    def check(self) -> None:
        check_positive("max_norm", self.max_norm)


@dataclass
class GlobalNormClippingConfig(ClippingConfig):
    """All gradients rescaled together to global norm <= max_norm (Keras `global_clipnorm`);
    max_norm null never clips: the unclipped baseline inside a sweep of the threshold."""

    name: str = "global_norm"
    # all gradients rescaled to global norm <= max_norm (Keras global_clipnorm); null: never
    max_norm: float | None = 40.0

    def check(self) -> None:
        need(self.max_norm is None or (finite(self.max_norm) and self.max_norm > 0), "max_norm",
             self.max_norm, "must be a positive number, or null (never clips)")


@dataclass
class AGCConfig(ClippingConfig):
    """Unit-wise (Brock et al. 2021): ||G_unit|| <= factor * max(||W_unit||, eps), per unit."""

    name: str = "agc"
    # lambda: a unit's gradient norm <= factor * max(||W_unit||, eps). The paper's 0.01 is for a
    # batch-mean loss; trainer.loss_reduction=sum makes gradients batch_size times larger, so
    # 0.01 x 64 compares with it
    factor: float = 0.64
    eps: float = 0.001  # floor on ||W_unit||, so zero-initialised units (biases) can still move
    exclude_output: bool = True  # the output layer is not clipped (as in the paper)

    def check(self) -> None:
        check_positive("factor", self.factor)
        check_positive("eps", self.eps)


@dataclass
class AutoClipConfig(ClippingConfig):
    """Global norm clipped at the `percentile`-th percentile of the norms seen so far."""

    name: str = "autoclip"
    percentile: float = 10.0  # clip the global norm at this percentile of the norms seen so far
    history: int = 10000  # the last `history` norms are kept

    def check(self) -> None:
        need(0 <= self.percentile <= 100, "percentile", self.percentile,
             "must be a number in [0, 100]")
        at_least(self, 1, "history")


@dataclass
class AdaGCConfig(ClippingConfig):
    """Each tensor's norm clipped at clip_ratio times an EMA of its own clipped norms, after a
    warm-up of global-norm clipping (Wang et al. 2025)."""

    name: str = "adagc"
    clip_ratio: float = 1.04  # lambda_rel: a tensor is clipped above clip_ratio * its EMA
    beta: float = 0.99  # EMA factor of each tensor's clipped norm
    warmup_steps: int = 100  # steps of global-norm clipping first (0: none)
    warmup_max_norm: float | None = 40.0  # lambda_abs, the warm-up's bound; null: no clipping

    def check(self) -> None:
        check_positive("clip_ratio", self.clip_ratio)
        need(finite(self.beta) and 0 <= self.beta < 1, "beta", self.beta, "must be in [0, 1)")
        at_least(self, 0, "warmup_steps")
        need(self.warmup_max_norm is None
             or (finite(self.warmup_max_norm) and self.warmup_max_norm > 0), "warmup_max_norm",
             self.warmup_max_norm, "must be a positive number, or null (no warm-up clipping)")


@dataclass
class ZClipConfig(ClippingConfig):
    """Global norm clipped when it is a spike against an EMA of past norms (z-score above
    z_threshold, or above mean + z_threshold * std in mode percentile), optionally capped."""

    name: str = "zclip"
    alpha: float = 0.97  # EMA factor of the mean and variance of the norm
    z_threshold: float = 2.5  # clip when (norm - mean) / std exceeds this
    warmup_steps: int = 25  # norms collected to initialise the statistics (only the cap)
    mode: str = "zscore"  # zscore or percentile
    clip_option: str = "adaptive_scaling"  # mode zscore: adaptive_scaling or mean
    clip_factor: float = 1.0  # adaptive_scaling: the clipped norm's multiplier, in (0, 1]
    max_grad_norm: float | None = None  # a fixed cap on the global norm, warm-up included

    def check(self) -> None:
        need(0 < self.alpha < 1, "alpha", self.alpha, "must be in (0, 1)")
        check_positive("z_threshold", self.z_threshold)
        at_least(self, 1, "warmup_steps")
        one_of("mode", self.mode, ZCLIP_MODES)
        one_of("clip_option", self.clip_option, ZCLIP_OPTIONS)
        need(finite(self.clip_factor) and 0 < self.clip_factor <= 1, "clip_factor",
             self.clip_factor, "must be a number in (0, 1]")
        need(self.max_grad_norm is None or (finite(self.max_grad_norm) and self.max_grad_norm > 0),
             "max_grad_norm", self.max_grad_norm, "must be a positive number, or null (no cap)")
        # Refused rather than ignored, as the reference does: a sweep would label runs by them.
        if self.mode == "percentile":
            need(self.clip_option == "adaptive_scaling", "clip_option", self.clip_option,
                 "not used by mode=percentile (leave it at adaptive_scaling)")
        unused_by = ("mode=percentile" if self.mode == "percentile"
                     else "clip_option=mean" if self.clip_option == "mean" else None)
        need(unused_by is None or self.clip_factor == 1, "clip_factor", self.clip_factor,
             f"not used by {unused_by} (leave it at 1.0)")
