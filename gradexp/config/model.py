"""The `model` group's schemas (conf/model/): each model's keys, its checks, the names of the
positions where a clip layer may go, and which inputs it takes. The builders are in
gradexp/parts/models.py, registered under the same names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING, DictConfig, OmegaConf

from gradexp.config.base import (
    Choice,
    ConfigError,
    Registry,
    any_keys,
    at_least,
    finite,
    need,
    one_of,
)

ACTIVATIONS = ("relu", "tanh", "sigmoid", "gelu", "elu", "selu", "silu", "softplus", "linear")
INITIALIZERS = (
    "glorot_uniform", "glorot_normal", "he_uniform", "he_normal", "lecun_uniform",
    "lecun_normal", "orthogonal", "random_normal", "random_uniform",
)
CELLS = ("simple", "lstm", "gru")
NORMS = ("pre", "post")
# What one example is, by the rank of its shape (see `input_kind`); each model says which it takes
VECTORS, SEQUENCES, IMAGES = "vectors", "sequences", "images"  # (F,), (T, F), (H, W, C)


@dataclass
class ModelConfig(Choice):
    """A model: `INPUTS` the kinds of example it takes (`NEEDS` says so in words)."""

    OPTIONS: ClassVar[Registry] = Registry("model", "schema", "gradexp/config/model.py")
    INPUTS: ClassVar[tuple[str, ...]] = ()
    NEEDS: ClassVar[str] = ""

    def positions(self) -> list[str] | None:
        """Where a clip layer may go, in model order (None: the built model's layers say)."""
        raise NotImplementedError


@dataclass
class MLPConfig(ModelConfig):
    """Inputs flattened, `depth` hidden Dense layers of `width` units, a Dense output layer."""

    name: str = "mlp"
    depth: int = 3
    width: int = 128
    activation: str = "relu"  # of the hidden layers (the output layer is linear)
    # Keras kernel initializer of every Dense layer, the output layer's too
    initializer: str = "glorot_uniform"
    INPUTS: ClassVar[tuple[str, ...]] = (VECTORS, SEQUENCES, IMAGES)
    NEEDS: ClassVar[str] = "any inputs"

    def positions(self) -> list[str]:
        return [f"dense_{i}" for i in range(1, self.depth + 1)]

    def check(self) -> None:
        at_least(self, 1, "depth", "width")
        one_of("activation", self.activation, ACTIVATIONS)
        one_of("initializer", self.initializer, INITIALIZERS)


@dataclass
class CNNConfig(ModelConfig):
    """`blocks` × [Conv2D of filters·2^(i-1) (kernel_size², same padding) → activation → 2×2
    max-pool], then one Dense layer of `width` units, then the output layer. Sequences (T, F)
    get the same blocks in 1-D (Conv1D of kernel_size along T, max-pool by 2)."""

    name: str = "cnn"
    blocks: int = 2
    filters: int = 16  # conv_1's; conv_i has filters·2^(i-1)
    kernel_size: int = 3  # kernel_size × kernel_size (images), kernel_size steps (sequences)
    width: int = 64
    activation: str = "relu"  # of the conv and hidden Dense layers (the output layer is linear)
    # Keras kernel initializer of every conv and Dense layer, the output layer's too
    initializer: str = "he_normal"
    INPUTS: ClassVar[tuple[str, ...]] = (IMAGES, SEQUENCES)
    NEEDS: ClassVar[str] = "image inputs (H, W, C) or sequences (T, F), convolved along T"

    def positions(self) -> list[str]:
        return [f"conv_{i}" for i in range(1, self.blocks + 1)] + ["dense_1"]

    def check(self) -> None:
        at_least(self, 1, "blocks", "filters", "kernel_size", "width")
        one_of("activation", self.activation, ACTIVATIONS)
        one_of("initializer", self.initializer, INITIALIZERS)


@dataclass
class RNNConfig(ModelConfig):
    """`layers` stacked recurrent layers of `units` (`cell`: simple | lstm | gru); the output
    layer reads the last one's final output (`readout: last`) or its outputs at every step,
    flattened (`readout: all`, MNIST-1D's GRU). Images are read row by row (H steps of W·C
    features).

    Positions of layer i: `rnn_<i>_state`, inside the recurrence (the hidden state h_t, at every
    time step: backpropagation through time is clipped step by step), then `rnn_<i>`, the
    layer's output. `init: keras`: the recurrent kernel starts as `recurrent_gain` × a random
    orthogonal matrix (above 1, gradients through time can explode), the others Glorot;
    `init: pascanu2013` (the paper's "smart_tanh", gradexp/parts/models.py SparseSpectral): 15
    non-zeros per row scaled to spectral radius `recurrent_gain`, inputs and output ~ N(0, 0.01²).
    """

    name: str = "rnn"
    cell: str = "simple"  # simple | lstm | gru
    units: int = 32
    layers: int = 1
    activation: str = "tanh"  # of the state (simple) or the candidate (lstm, gru)
    # recurrent kernel = gain x random orthogonal; > 1 lets gradients explode
    recurrent_gain: float = 1.0
    init: str = "keras"  # pascanu2013: sparse recurrent kernel of spectral radius recurrent_gain
    # the head reads the final output; all: every step's output, flattened (MNIST-1D's GRU)
    readout: str = "last"
    unroll: bool = False  # XLA gets the T steps written out: ~1.3x the steps/s at T = 50
    INITS: ClassVar[tuple[str, ...]] = ("keras", "pascanu2013")
    READOUTS: ClassVar[tuple[str, ...]] = ("last", "all")
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
        one_of("init", self.init, self.INITS)
        one_of("readout", self.readout, self.READOUTS)


@dataclass
class TransformerConfig(ModelConfig):
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
    blocks: int = 2
    width: int = 32
    heads: int = 2  # attention heads of width/heads dimensions each (width: a multiple of heads)
    mlp_width: int = 64
    activation: str = "gelu"  # of the MLP's hidden layer (mlp_width units)
    norm: str = "pre"  # pre: x + f(LN(x)); post: LN(x + f(x)), the original, less stable
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


@dataclass
class KerasModelConfig(ModelConfig):
    """A Keras model of the user's: `build` is a dotted path (`my_pkg.models:make`) to
    `make(input_shape, num_outputs, **kwargs)`, which returns a Functional or Sequential model
    (a subclassed one holds its own ClipGradient layers). Its positions are its layers' names,
    known once it is built (gradexp/parts/insertion.py). `loss`: per example, `auto` (cross-entropy
    of logits, or squared error for regression), a Keras loss function's name (`huber`,
    `mean_absolute_error`, ...) or a dotted path to `loss(y, outputs) -> per-example loss`."""

    name: str = "keras"
    build: str = MISSING
    # keyword arguments of the builder: make(input_shape, num_outputs, **kwargs)
    kwargs: dict[str, Any] = field(default_factory=any_keys)
    loss: str = "auto"
    INPUTS: ClassVar[tuple[str, ...] | None] = None  # whatever the user's model takes
    NEEDS: ClassVar[str] = "what its builder makes it for"

    def positions(self) -> None:
        return None

    def check(self) -> None:
        need(isinstance(self.build, str) and bool(self.build.strip()), "build", self.build,
             "must be a dotted path such as my_package.models:make")


def input_kind(shape: tuple[int, ...]) -> str:
    """vectors (F,), sequences (T, F) or images (H, W, C): what one example is."""
    return {1: VECTORS, 2: SEQUENCES, 3: IMAGES}.get(len(shape), f"rank-{len(shape)} arrays")


def check_model_takes(model: Any, dataset_name: str, shape: tuple[int, ...]) -> None:
    """Raise ConfigError unless the model (its schema, or its config node) takes examples of
    `shape`."""
    if isinstance(model, DictConfig):
        model = OmegaConf.to_object(model)
    kind = input_kind(shape)
    if model.INPUTS is not None and shape is not None and kind not in model.INPUTS:
        raise ConfigError(f"model={model.name}: needs {model.NEEDS}; "
                          f"dataset={dataset_name} gives {kind} {tuple(shape)}")
