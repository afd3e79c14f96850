"""Config schemas, their registration with Hydra, and validation.

The dataclasses give keys and types; the values live in conf/*.yaml.
Nothing here imports TensorFlow: a bad value must be answered before the (slow) import.
Types and key names are checked by Hydra when it composes the config (the dataclasses below
are registered in its ConfigStore); values, choices and combinations by `validate`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, OmegaConfBaseException

from gradexp.rundir import NotResumable

DEVICES = ("auto", "cpu", "gpu")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("none", "mirrored")
ON_DIVERGENCE = ("stop", "continue")
ACTIVATIONS = ("relu", "tanh", "sigmoid", "gelu", "elu", "selu", "silu", "softplus", "linear")
INITIALIZERS = (
    "glorot_uniform", "glorot_normal", "he_uniform", "he_normal", "lecun_uniform",
    "lecun_normal", "orthogonal", "random_normal", "random_uniform",
)
LOSS_REDUCTIONS = ("sum", "mean")
NORM_AXES = ("batch", "example")
CELLS = ("simple", "lstm", "gru")
NORMS = ("pre", "post")


class ConfigError(ValueError):
    """A bad setting: the message is one line that names the key and what is allowed."""


def need(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise ConfigError('key=value: allowed') unless ok."""
    if not ok:
        raise ConfigError(f"{key}={_show(value)}: {allowed}")


def _show(value: Any) -> str:
    return "null" if value is None else str(value)


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    need(value in allowed, key, value, f"must be one of {', '.join(allowed)}")


def at_least(node: Any, minimum: float, *keys: str) -> None:
    for key in keys:
        value = getattr(node, key)
        kind = "an integer" if isinstance(value, int) else "a number"
        need(value >= minimum, key, value, f"must be {kind} >= {minimum}")


# Each group's options: a dataclass whose `check` raises ConfigError for a bad value, naming
# keys relative to the group (`validate` adds the group's name in front).

# ---------------------------------------------------------------------------------- models
# Each model schema also says which inputs it takes (`INPUTS`, kinds of input shape, see
# `input_kind`); `check_model_takes` holds that against the dataset's shape.
VECTORS, SEQUENCES, IMAGES = "vectors", "sequences", "images"  # (F,), (T, F), (H, W, C)


@dataclass
class MLPConfig:
    """Inputs flattened, `depth` hidden Dense layers of `width` units, a Dense output layer."""

    name: str = "mlp"
    depth: int = MISSING
    width: int = MISSING
    activation: str = MISSING
    initializer: str = MISSING
    INPUTS: ClassVar[tuple[str, ...]] = (VECTORS, SEQUENCES, IMAGES)
    NEEDS: ClassVar[str] = "any inputs"

    def positions(self) -> list[str]:
        return [f"dense_{i}" for i in range(1, self.depth + 1)]

    def check(self) -> None:
        at_least(self, 1, "depth", "width")
        one_of("activation", self.activation, ACTIVATIONS)
        one_of("initializer", self.initializer, INITIALIZERS)


@dataclass
class CNNConfig:
    """`blocks` × [Conv2D of filters·2^(i-1) (kernel_size², same padding) → activation → 2×2
    max-pool], then one Dense layer of `width` units, then the output layer."""

    name: str = "cnn"
    blocks: int = MISSING
    filters: int = MISSING
    kernel_size: int = MISSING
    width: int = MISSING
    activation: str = MISSING
    initializer: str = MISSING
    INPUTS: ClassVar[tuple[str, ...]] = (IMAGES,)
    NEEDS: ClassVar[str] = "image inputs (H, W, C)"

    def positions(self) -> list[str]:
        return [f"conv_{i}" for i in range(1, self.blocks + 1)] + ["dense_1"]

    def check(self) -> None:
        at_least(self, 1, "blocks", "filters", "kernel_size", "width")
        one_of("activation", self.activation, ACTIVATIONS)
        one_of("initializer", self.initializer, INITIALIZERS)


@dataclass
class RNNConfig:
    """`layers` stacked recurrent layers of `units` (`cell`: simple | lstm | gru); the last one's
    final output goes to the output layer. Images are read row by row (H steps of W·C features).

    Positions of layer i: `rnn_<i>_state`, inside the recurrence (the hidden state h_t, at every
    time step: backpropagation through time is clipped step by step), then `rnn_<i>`, the
    layer's output. The recurrent kernel starts as `recurrent_gain` × a random orthogonal
    matrix: above 1, gradients through time can explode.
    """

    name: str = "rnn"
    cell: str = MISSING
    units: int = MISSING
    layers: int = MISSING
    activation: str = MISSING  # of the state (simple) or the candidate (lstm, gru)
    recurrent_gain: float = MISSING
    INPUTS: ClassVar[tuple[str, ...]] = (SEQUENCES, IMAGES)
    NEEDS: ClassVar[str] = "sequence inputs (T, F) or images (H, W, C), read row by row"

    def positions(self) -> list[str]:
        return [p for i in range(1, self.layers + 1) for p in (f"rnn_{i}_state", f"rnn_{i}")]

    def check(self) -> None:
        one_of("cell", self.cell, CELLS)
        at_least(self, 1, "units", "layers")
        one_of("activation", self.activation, ACTIVATIONS)
        need(finite(self.recurrent_gain) and self.recurrent_gain > 0, "recurrent_gain",
             self.recurrent_gain, "must be a positive number")


@dataclass
class TransformerConfig:
    """A small encoder: inputs projected to `width` plus a learned position embedding, `blocks` ×
    [multi-head self-attention, MLP of `mlp_width`], each a residual branch with layer norm,
    then the mean over time and the output layer. Images are read row by row.

    norm=pre: x + f(LN(x)) (GPT-2 style, a final LN before pooling); norm=post: LN(x + f(x))
    (Vaswani et al. 2017), which needs a learning-rate warm-up to train stably (Xiong et al.
    2020). Positions: `embed` (the projected inputs), then per block `attn_<i>` and `mlp_<i>`,
    each branch's output before it joins the residual stream (so the skip connection carries
    the unclipped gradient past it).
    """

    name: str = "transformer"
    blocks: int = MISSING
    width: int = MISSING
    heads: int = MISSING
    mlp_width: int = MISSING
    activation: str = MISSING
    norm: str = MISSING
    INPUTS: ClassVar[tuple[str, ...]] = (SEQUENCES, IMAGES)
    NEEDS: ClassVar[str] = "sequence inputs (T, F) or images (H, W, C), read row by row"

    def positions(self) -> list[str]:
        return ["embed"] + [p for i in range(1, self.blocks + 1) for p in (f"attn_{i}", f"mlp_{i}")]

    def check(self) -> None:
        at_least(self, 1, "blocks", "width", "heads", "mlp_width")
        need(self.width % self.heads == 0, "width", self.width,
             f"must be a multiple of heads ({self.heads})")
        one_of("activation", self.activation, ACTIVATIONS)
        one_of("norm", self.norm, NORMS)


def input_kind(shape: tuple[int, ...]) -> str:
    """vectors (F,), sequences (T, F) or images (H, W, C): what one example is."""
    return {1: VECTORS, 2: SEQUENCES, 3: IMAGES}.get(len(shape), f"rank-{len(shape)} arrays")


def check_model_takes(model: Any, dataset_name: str, shape: tuple[int, ...]) -> None:
    """Raise ConfigError unless the model schema `model` takes examples of `shape`."""
    kind = input_kind(shape)
    if kind not in model.INPUTS:
        raise ConfigError(f"model={model.name}: needs {model.NEEDS}; "
                          f"dataset={dataset_name} gives {kind} {tuple(shape)}")


# -------------------------------------------------------------------------------- datasets
@dataclass
class SyntheticConfig:
    """Gaussian clusters: class means ~ N(0, separation² I), x = mean + N(0, I)."""

    name: str = "synthetic"
    num_examples: int = MISSING
    num_features: int = MISSING
    num_classes: int = MISSING
    separation: float = MISSING
    val_fraction: float = MISSING
    seed: int = MISSING  # the data stay the same across run seeds; `seed` varies init and order

    def input_shape(self) -> tuple[int, ...]:
        return (self.num_features,)

    def check(self) -> None:
        at_least(self, 2, "num_examples", "num_classes")
        at_least(self, 1, "num_features")
        need(finite(self.separation) and self.separation >= 0, "separation", self.separation,
             "must be a number >= 0")
        check_val_fraction(self.val_fraction)


@dataclass
class DigitsConfig:
    """scikit-learn's 8x8 handwritten digits (1797 images), read from inside its wheel."""

    name: str = "digits"
    val_fraction: float = MISSING
    seed: int = MISSING

    def input_shape(self) -> tuple[int, ...]:
        return (8, 8, 1)

    def check(self) -> None:
        check_val_fraction(self.val_fraction)


@dataclass
class AddingConfig:
    """The adding problem: `length` steps of (value, marker), target = the sum of the two marked
    values (regression). Definition in gradexp/data.py `adding`."""

    name: str = "adding"
    num_examples: int = MISSING
    length: int = MISSING
    val_fraction: float = MISSING
    seed: int = MISSING

    def input_shape(self) -> tuple[int, ...]:
        return (self.length, 2)

    def check(self) -> None:
        at_least(self, 2, "num_examples", "length")  # one marker in each half
        check_val_fraction(self.val_fraction)


@dataclass
class TeacherConfig:
    """Regression on a random deep tanh network's output, for deep MLPs (gradexp/data.py
    `teacher`): `depth` layers of `width`, weights N(0, gain²/fan_in), targets standardised."""

    name: str = "teacher"
    num_examples: int = MISSING
    num_features: int = MISSING
    depth: int = MISSING
    width: int = MISSING
    gain: float = MISSING
    noise: float = MISSING
    val_fraction: float = MISSING
    seed: int = MISSING

    def input_shape(self) -> tuple[int, ...]:
        return (self.num_features,)

    def check(self) -> None:
        at_least(self, 2, "num_examples")
        at_least(self, 1, "num_features", "depth", "width")
        need(finite(self.gain) and self.gain > 0, "gain", self.gain, "must be a positive number")
        need(finite(self.noise) and self.noise >= 0, "noise", self.noise, "must be a number >= 0")
        check_val_fraction(self.val_fraction)


@dataclass
class KerasImagesConfig:
    """An image set of keras.datasets: its training and test files pooled, then split by
    `val_fraction` like every dataset. The files are read from `cache_dir` (null: Keras's own,
    $KERAS_HOME/datasets or ~/.keras/datasets) and downloaded there when missing."""

    name: str = MISSING
    cache_dir: str | None = MISSING
    num_examples: int | None = MISSING  # null: all; else a random subset (by `seed`) of this many
    val_fraction: float = MISSING
    seed: int = MISSING
    SHAPE: ClassVar[tuple[int, ...]] = ()

    def input_shape(self) -> tuple[int, ...]:
        return self.SHAPE

    def check(self) -> None:
        need(self.num_examples is None or self.num_examples >= 2, "num_examples",
             self.num_examples, "must be an integer >= 2, or null (all)")
        check_val_fraction(self.val_fraction)


@dataclass
class MNISTConfig(KerasImagesConfig):
    """LeCun et al.'s handwritten digits: 70 000 28×28 grey images, 10 classes."""

    name: str = "mnist"
    SHAPE: ClassVar[tuple[int, ...]] = (28, 28, 1)


@dataclass
class FashionMNISTConfig(KerasImagesConfig):
    """Zalando's Fashion-MNIST: 70 000 28×28 grey images of clothes, 10 classes."""

    name: str = "fashion_mnist"
    SHAPE: ClassVar[tuple[int, ...]] = (28, 28, 1)


@dataclass
class CIFAR10Config(KerasImagesConfig):
    """Krizhevsky's CIFAR-10: 60 000 32×32 colour images, 10 classes."""

    name: str = "cifar10"
    SHAPE: ClassVar[tuple[int, ...]] = (32, 32, 3)


def check_val_fraction(value: float) -> None:
    need(0 < value < 1, "val_fraction", value, "must be between 0 and 1 (exclusive)")


# ------------------------------------------------------------------------------ optimizers
@dataclass
class SGDConfig:
    name: str = "sgd"
    learning_rate: float = MISSING
    momentum: float = MISSING
    nesterov: bool = MISSING

    def check(self) -> None:
        check_learning_rate(self.learning_rate)
        need(0 <= self.momentum < 1, "momentum", self.momentum, "must be in [0, 1)")


@dataclass
class AdamConfig:
    name: str = "adam"
    learning_rate: float = MISSING
    beta_1: float = MISSING
    beta_2: float = MISSING
    epsilon: float = MISSING

    def check(self) -> None:
        check_learning_rate(self.learning_rate)
        for key in ("beta_1", "beta_2"):
            need(0 <= getattr(self, key) < 1, key, getattr(self, key), "must be in [0, 1)")
        need(self.epsilon > 0, "epsilon", self.epsilon, "must be a positive number")


def check_learning_rate(value: float) -> None:
    need(finite(value) and value > 0, "learning_rate", value, "must be a positive number")


# ------------------------------------------------------------------------------- clipping
# Parameter-gradient clipping, between tape.gradient and optimizer.apply (gradexp/clipping.py).
@dataclass
class NoClippingConfig:
    """The gradients as they are (the statistics are still measured)."""

    name: str = "none"

    def check(self) -> None:
        pass


@dataclass
class ValueClippingConfig:
    """Each element clipped to [-max_value, max_value] (Keras `clipvalue`)."""

    name: str = "value"
    max_value: float = MISSING

    def check(self) -> None:
        check_positive("max_value", self.max_value)


@dataclass
class NormClippingConfig:
    """Each gradient tensor rescaled to norm <= max_norm (Keras `clipnorm`)."""

    name: str = "norm"
    max_norm: float = MISSING

    def check(self) -> None:
        check_positive("max_norm", self.max_norm)


@dataclass
class GlobalNormClippingConfig:
    """All gradients rescaled together to global norm <= max_norm (Keras `global_clipnorm`)."""

    name: str = "global_norm"
    max_norm: float = MISSING

    def check(self) -> None:
        check_positive("max_norm", self.max_norm)


@dataclass
class AGCConfig:
    """Unit-wise (Brock et al. 2021): ||G_unit|| <= factor * max(||W_unit||, eps), per unit."""

    name: str = "agc"
    factor: float = MISSING
    eps: float = MISSING
    exclude_output: bool = MISSING  # the output layer is not clipped (as in the paper)

    def check(self) -> None:
        check_positive("factor", self.factor)
        check_positive("eps", self.eps)


@dataclass
class AutoClipConfig:
    """Global norm clipped at the `percentile`-th percentile of the norms seen so far."""

    name: str = "autoclip"
    percentile: float = MISSING
    history: int = MISSING  # the last `history` norms are kept

    def check(self) -> None:
        need(0 <= self.percentile <= 100, "percentile", self.percentile,
             "must be a number in [0, 100]")
        at_least(self, 1, "history")


@dataclass
class ZClipConfig:
    """Global norm clipped when its z-score against an EMA of past norms exceeds z_threshold."""

    name: str = "zclip"
    alpha: float = MISSING  # EMA factor of the mean and variance of the norm
    z_threshold: float = MISSING
    warmup_steps: int = MISSING  # norms collected to initialise the statistics; no clipping

    def check(self) -> None:
        need(0 < self.alpha < 1, "alpha", self.alpha, "must be in (0, 1)")
        check_positive("z_threshold", self.z_threshold)
        at_least(self, 1, "warmup_steps")


def check_positive(key: str, value: float) -> None:
    need(finite(value) and value > 0, key, value, "must be a positive number")


# ------------------------------------------------------------------------ layer and trainer
@dataclass
class LayerConfig:
    """The seed's layer: forward y = scale·x, backward dx = clip(grad_scale·dy, clip_min, clip_max).

    clip_min / clip_max override the top-level `clip` (which means ±clip); null: no bound.
    max_norm: then rescale dx to norm <= max_norm, over the batch or per example (norm_axis).
    positions: `all` (after every hidden layer), or a list of the model's position names.
    """

    clip_min: float | None = MISSING
    clip_max: float | None = MISSING
    max_norm: float | None = MISSING
    norm_axis: str = MISSING
    scale: float = MISSING
    grad_scale: float = MISSING
    positions: Any = MISSING

    def check(self) -> None:
        for side in ("clip_min", "clip_max"):
            value = getattr(self, side)
            need(value is None or not math.isnan(value), side, value, "must be a number or null")
        need(self.max_norm is None or (finite(self.max_norm) and self.max_norm > 0), "max_norm",
             self.max_norm, "must be a positive number or null")
        one_of("norm_axis", self.norm_axis, NORM_AXES)
        need(finite(self.scale), "scale", self.scale, "must be a finite number")
        need(finite(self.grad_scale), "grad_scale", self.grad_scale,
             "must be a finite number (negative reverses the gradient)")


@dataclass
class TrainerConfig:
    steps: int = MISSING
    batch_size: int = MISSING
    log_every: int = MISSING  # fetch measurements, write table and TensorBoard, print progress
    eval_every: int = MISSING
    histogram_every: int = MISSING  # gradient histograms in TensorBoard; 0: never
    loss_reduction: str = MISSING  # sum: dy is in per-example units whatever the batch size
    divergence_factor: float = MISSING  # loss above this × the first loss: diverged
    jit_compile: bool = MISSING  # XLA-compile the step
    checkpoint_every: int = MISSING  # 0: only when the run stops
    on_divergence: str = MISSING  # stop | continue (skipping non-finite updates)

    def check(self) -> None:
        at_least(self, 1, "steps", "batch_size", "log_every", "eval_every")
        need(self.histogram_every >= 0, "histogram_every", self.histogram_every,
             "must be an integer >= 0 (0: no histograms)")
        one_of("loss_reduction", self.loss_reduction, LOSS_REDUCTIONS)
        need(self.divergence_factor > 1, "divergence_factor", self.divergence_factor,
             "must be a number > 1")
        need(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every,
             "must be an integer >= 0 (0: only when the run stops)")
        one_of("on_divergence", self.on_divergence, ON_DIVERGENCE)


@dataclass
class Config:
    model: Any = MISSING
    dataset: Any = MISSING
    optimizer: Any = MISSING
    clipping: Any = MISSING
    layer: LayerConfig = field(default_factory=LayerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    clip: float | None = MISSING
    seed: int = MISSING
    device: str = MISSING
    precision: str = MISSING
    strategy: str = MISSING
    deterministic: bool = MISSING
    resume: str | None = MISSING


SCHEMAS = {
    "model": [MLPConfig, CNNConfig, RNNConfig, TransformerConfig],
    "dataset": [SyntheticConfig, DigitsConfig, AddingConfig, TeacherConfig,
                MNISTConfig, FashionMNISTConfig, CIFAR10Config],
    "optimizer": [SGDConfig, AdamConfig],
    "clipping": [NoClippingConfig, ValueClippingConfig, NormClippingConfig,
                 GlobalNormClippingConfig, AGCConfig, AutoClipConfig, ZClipConfig],
}
CHECKED = ("model", "dataset", "optimizer", "clipping", "layer", "trainer")  # nodes with a `check`


def register() -> None:
    """Put the schemas in Hydra's ConfigStore; conf/<group>/<name>.yaml extend them."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, schemas in SCHEMAS.items():
        for schema in schemas:
            cs.store(name=f"{group}_{schema().name}_schema", node=schema)


register()


def _run_dir(resume: str | None, new_dir: str) -> str:
    return resume or new_dir


def _hydra_subdir(resume: str | None) -> str:
    """A resumed run keeps its .hydra/ files; the resuming command's go beside them."""
    return ".hydra" if not resume else f".hydra/resumed-{datetime.now():%Y-%m-%d_%H-%M-%S}"


OmegaConf.register_new_resolver("gradexp.run_dir", _run_dir, replace=True)
OmegaConf.register_new_resolver("gradexp.hydra_subdir", _hydra_subdir, replace=True)


# ------------------------------------------------------------------------------ validation
def clip_bounds(cfg: DictConfig) -> tuple[float | None, float | None]:
    """(clip_min, clip_max) of the inserted layers: layer.clip_min/max, else ±clip, else None."""
    low, high = cfg.layer.clip_min, cfg.layer.clip_max
    if cfg.clip is not None:
        low = -cfg.clip if low is None else low
        high = cfg.clip if high is None else high
    return low, high


def positions(cfg: DictConfig) -> list[str]:
    """The model positions that get a clip layer, in model order."""
    available = OmegaConf.to_object(cfg.model).positions()
    wanted = cfg.layer.positions
    if wanted == "all":
        return available
    if isinstance(wanted, str) or not isinstance(wanted, (list, ListConfig)):
        wanted = [wanted]
    unknown = [p for p in wanted if p not in available]
    if unknown:
        raise ConfigError(
            f"layer.positions={unknown[0]}: no such position in model={cfg.model.name}; "
            f"allowed: all, or a list of {', '.join(available)}"
        )
    return [p for p in available if p in wanted]


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError (one line naming the key) for the first bad value in `cfg`."""
    _unknown_keys(cfg)
    need(cfg.clip is None or (finite(cfg.clip) and cfg.clip > 0), "clip", cfg.clip,
         "must be a positive number or null (null: no clipping)")
    # keras.utils.set_random_seed passes it to NumPy, which takes [0, 2**32 - 1] only
    need(0 <= cfg.seed <= 2**32 - 1, "seed", cfg.seed, "must be an integer in [0, 2**32 - 1]")
    one_of("device", cfg.device, DEVICES)
    one_of("precision", cfg.precision, PRECISIONS)
    one_of("strategy", cfg.strategy, STRATEGIES)
    if cfg.strategy == "mirrored" and cfg.trainer.on_divergence == "continue":
        raise ConfigError("trainer.on_divergence=continue, strategy=mirrored: skipping "
                          "non-finite updates works on one device only; use one of them")
    for group in CHECKED:
        try:
            OmegaConf.to_object(cfg[group]).check()
        except ConfigError as exc:
            raise ConfigError(f"{group}.{exc}") from None
    dataset = OmegaConf.to_object(cfg.dataset)
    check_model_takes(OmegaConf.to_object(cfg.model), dataset.name, dataset.input_shape())
    low, high = clip_bounds(cfg)
    if low is not None and high is not None and low > high:
        raise ConfigError(f"layer.clip_min={_show(low)}, layer.clip_max={_show(high)}: "
                          "clip_min must not exceed clip_max")
    positions(cfg)


def _unknown_keys(node: DictConfig, prefix: str = "") -> None:
    """`+key=value` slips past Hydra's struct check: refuse keys no schema declares."""
    schema = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(schema):
        allowed = _schema_keys(schema)
        for key in node:
            if key not in allowed and not (prefix == "" and key == "hydra"):
                raise ConfigError(f"{prefix}{key}: no such key; allowed: {', '.join(allowed)}")
    for key in node:
        child = node._get_node(key)
        if key == "hydra" or not isinstance(child, DictConfig):
            continue
        if not child._is_missing() and not child._is_none():
            _unknown_keys(child, f"{prefix}{key}.")


def _schema_keys(schema: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(schema)]


def explain(exc: BaseException) -> str | None:
    """One line for a bad-input error from Hydra, OmegaConf or `validate`; None otherwise."""
    if isinstance(exc, (ConfigError, NotResumable)):
        return str(exc)
    if isinstance(exc, MissingConfigException) and exc.options is not None and exc.missing_cfg_file:
        group, _, name = exc.missing_cfg_file.rpartition("/")
        return f"{group}={name}: no such option; choose one of {', '.join(sorted(exc.options))}"
    cause = exc.__cause__
    if isinstance(exc, ConfigCompositionException) and isinstance(cause, OmegaConfBaseException):
        key = getattr(cause, "full_key", None) or "config"
        if str(exc).startswith("Error merging override "):
            key = str(exc).removeprefix("Error merging override ")
        reason = str(cause).splitlines()[0]
        schema = getattr(cause, "object_type", None)
        if isinstance(cause, ConfigAttributeError) and dataclasses.is_dataclass(schema):
            reason = f"no such key; allowed: {', '.join(_schema_keys(schema))}"
        return f"{key}: {reason}"
    if isinstance(exc, (OverrideParseException, ConfigCompositionException)):
        return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return None


def check_device(device: str) -> None:
    """device=gpu needs a GPU; only this check loads TensorFlow, and only when it is asked."""
    if device == "gpu":
        from gradexp.devices import require_gpu

        require_gpu()


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """The override lists of a basic-sweeper multirun (`hydra.sweeper.params`, then the CLI)."""
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    parsed = OverridesParser.create().parse_overrides(arguments)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
