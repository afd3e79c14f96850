"""Keras models with clip layers at named positions.

Each builder `f(model_cfg, inputs, num_outputs, tap) -> outputs`, registered by `@model(name)`
under its schema's name, calls `tap(name, x)` at every position where a clip layer may go, in
model order (the names are the schema's `positions()`, see gradexp/config/model.py): `tap`
returns x through a `ClipGradient` layer named `clip_<name>` where the ClipSpec puts one, and x
itself elsewhere. A position inside another layer (the recurrence of an RNN) asks
`tap.layer(name)` for the clip layer itself (None where none is asked for).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from omegaconf import DictConfig, OmegaConf

from gradexp._tf import keras
from gradexp.config import ClipSpec, Registry
from gradexp.parts import insertion
from gradexp.parts.layers import ClipGradient

HEAD = "head"  # every builder's output layer: logits, or the regression output
CLIP_PREFIX = "clip_"  # the clip layer at position p is named clip_p (`position`)
BUILDERS = Registry("model", "builder", "gradexp/parts/models.py")
model = BUILDERS.add  # @model("mlp"): the builder of model=mlp

class Tap:
    """Hands out the clip layers of the chosen positions and records every position asked for."""

    def __init__(self, chosen: list[str], make_layer: Callable[[str], ClipGradient]):
        self.chosen, self.make_layer, self.tapped = chosen, make_layer, []

    def layer(self, name: str) -> ClipGradient | None:
        self.tapped.append(name)
        return self.make_layer(name) if name in self.chosen else None

    def __call__(self, name: str, x):
        layer = self.layer(name)
        return x if layer is None else layer(x)


# ------------------------------------------------------------------------------ builders
@model("mlp")
def mlp(m: DictConfig, x, num_outputs: int, tap: Tap):
    x = keras.layers.Flatten(name="flatten")(x)
    for name in OmegaConf.to_object(m).positions():
        x = keras.layers.Dense(m.width, m.activation, kernel_initializer=m.initializer,
                               name=name)(x)
        x = tap(name, x)
    return keras.layers.Dense(num_outputs, kernel_initializer=m.initializer, name=HEAD)(x)


@model("cnn")
def cnn(m: DictConfig, x, num_outputs: int, tap: Tap):
    """Images (H, W, C): 2-D convolutions; sequences (T, F): 1-D ones, along T (MNIST-1D)."""
    image = len(x.shape) == 4
    conv = keras.layers.Conv2D if image else keras.layers.Conv1D
    pool = keras.layers.MaxPooling2D if image else keras.layers.MaxPooling1D
    for i in range(1, m.blocks + 1):
        x = conv(m.filters * 2 ** (i - 1), m.kernel_size, padding="same",
                 activation=m.activation, kernel_initializer=m.initializer, name=f"conv_{i}")(x)
        x = tap(f"conv_{i}", x)
        x = pool(2, padding="same", name=f"pool_{i}")(x)  # 1×1 stays 1×1
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(m.width, m.activation, kernel_initializer=m.initializer,
                           name="dense_1")(x)
    x = tap("dense_1", x)
    return keras.layers.Dense(num_outputs, kernel_initializer=m.initializer, name=HEAD)(x)


RNN_CELLS = {"simple": keras.layers.SimpleRNNCell, "lstm": keras.layers.LSTMCell,
             "gru": keras.layers.GRUCell}


@model("rnn")
def rnn(m: DictConfig, x, num_outputs: int, tap: Tap):
    x = as_sequence(x)
    pascanu = m.init == "pascanu2013"
    small = keras.initializers.RandomNormal(stddev=0.01)  # pascanur/trainingRNNs "smart_tanh"
    for i in range(1, m.layers + 1):
        recurrent = (SparseSpectral(m.recurrent_gain) if pascanu
                     else keras.initializers.Orthogonal(gain=m.recurrent_gain))
        cell = RNN_CELLS[m.cell](
            m.units, activation=m.activation, name=f"rnn_{i}_cell",
            recurrent_initializer=recurrent,
            kernel_initializer=small if pascanu else "glorot_uniform")
        state_clip = tap.layer(f"rnn_{i}_state")
        if state_clip is not None:
            cell = ClippedStateCell(cell, state_clip, name=f"rnn_{i}_clipped_cell")
        every_step = i < m.layers or m.readout == "all"
        x = keras.layers.RNN(cell, return_sequences=every_step, name=f"rnn_{i}",
                             unroll=m.unroll)(x)
        x = tap(f"rnn_{i}", x)
    if m.readout == "all":
        x = keras.layers.Flatten(name="flatten")(x)
    return keras.layers.Dense(num_outputs, name=HEAD,
                              kernel_initializer=small if pascanu else "glorot_uniform")(x)


class SparseSpectral(keras.initializers.Initializer):
    """The recurrent matrix of Pascanu et al. (2013), "smart_tanh" in pascanur/trainingRNNs
    RNN.py: `connections` non-zero entries ~ N(0, 0.01²) per row at random columns, then the
    matrix scaled to spectral radius `radius` (max |eigenvalue|). NumPy's generator, seeded
    from Keras's global seed (keras.utils.set_random_seed seeds it too)."""

    def __init__(self, radius: float, connections: int = 15):
        self.radius, self.connections = radius, connections

    def __call__(self, shape, dtype=None):
        rows, columns = shape
        w = np.zeros(shape)
        for row in range(rows):
            chosen = np.random.permutation(columns)[:self.connections]
            w[row, chosen] = np.random.normal(0.0, 0.01, len(chosen))
        w *= self.radius / np.max(np.abs(np.linalg.eigvals(w)))
        return keras.ops.convert_to_tensor(w, dtype=dtype or "float32")

    def get_config(self):
        return {"radius": self.radius, "connections": self.connections}


@model("transformer")
def transformer(m: DictConfig, x, num_outputs: int, tap: Tap):
    x = keras.layers.Dense(m.width, name="embed")(as_sequence(x))
    x = tap("embed", PositionEmbedding(name="position")(x))
    for i in range(1, m.blocks + 1):
        def attention(h, i=i):
            return keras.layers.MultiHeadAttention(m.heads, m.width // m.heads,
                                                   name=f"attn_{i}")(h, h)

        def feed_forward(h, i=i):
            h = keras.layers.Dense(m.mlp_width, m.activation, name=f"mlp_{i}_in")(h)
            return keras.layers.Dense(m.width, name=f"mlp_{i}_out")(h)

        x = residual(x, attention, f"attn_{i}", m.norm, tap)
        x = residual(x, feed_forward, f"mlp_{i}", m.norm, tap)
    if m.norm == "pre":
        x = keras.layers.LayerNormalization(name="final_norm")(x)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    return keras.layers.Dense(num_outputs, name=HEAD)(x)


def residual(x, branch, name: str, norm: str, tap: Tap):
    """pre: x + tap(f(LN(x))); post: LN(x + tap(f(x))). The tap is on the branch's output."""
    norm_layer = keras.layers.LayerNormalization(name=f"{name}_norm")
    add = keras.layers.Add(name=f"{name}_add")
    if norm == "pre":
        return add([x, tap(name, branch(norm_layer(x)))])
    return norm_layer(add([x, tap(name, branch(x))]))


def as_sequence(x):
    """Images (H, W, C) read row by row: H time steps of W·C features. Sequences unchanged."""
    if len(x.shape) == 4:
        _, height, width, channels = x.shape
        return keras.layers.Reshape((height, width * channels), name="rows")(x)
    return x


# -------------------------------------------------------------------------------- layers
@keras.saving.register_keras_serializable(package="gradexp")
class ClippedStateCell(keras.layers.Layer):
    """A recurrent cell whose new hidden state passes a clip layer at every time step:

        h_t = clip(cell(x_t, state_{t-1}).h)      output_t = h_t

    Forward, the clip layer only scales (y = scale·x). Backward, in backpropagation through
    time, the whole gradient reaching h_t (from output_t and from step t+1) is clipped before
    it flows into step t, so the clip acts T times per sequence; its statistics add up over
    the steps. An LSTM's carry c_t is not clipped, only h_t.
    """

    # Keras reads this signature when it makes the layer: mutation testing leaves it whole
    # (mutmut's wrapper would hide it; tests/mutation.py)
    def __init__(self, cell, clip, **kwargs):  # pragma: no mutate block
        super().__init__(**kwargs)
        self.cell, self.clip = cell, clip
        self.state_size, self.output_size = cell.state_size, cell.output_size

    def build(self, input_shape):
        for layer, shape in ((self.cell, input_shape), (self.clip, (None, self.output_size))):
            if not layer.built:  # a loaded model's cell comes built
                layer.build(shape)

    def call(self, inputs, states, training=False):
        h, new_states = self.cell(inputs, states, training=training)
        h = self.clip(h)
        new_states = [h, *new_states[1:]] if isinstance(new_states, (list, tuple)) else h
        return h, new_states

    def get_initial_state(self, batch_size=None):
        return self.cell.get_initial_state(batch_size)

    def get_config(self):
        return {**super().get_config(),
                "cell": keras.saving.serialize_keras_object(self.cell),
                "clip": keras.saving.serialize_keras_object(self.clip)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        cell = keras.saving.deserialize_keras_object(config.pop("cell"))
        clip = keras.saving.deserialize_keras_object(config.pop("clip"))
        return cls(cell, clip, **config)


@keras.saving.register_keras_serializable(package="gradexp")
class PositionEmbedding(keras.layers.Layer):
    """x + P with P a learned (T, width) matrix: attention alone is blind to order."""

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            name="embeddings", shape=tuple(input_shape[1:]),
            initializer=keras.initializers.RandomNormal(stddev=0.02))

    def call(self, x):
        return x + self.embeddings


# ---------------------------------------------------------------------------------- model
def build(m: DictConfig, clip: ClipSpec, input_shape: tuple[int, ...],
          num_outputs: int) -> keras.Model:
    """The model of config node `m` for examples of `input_shape` (the caller checks that it
    takes them: config.check_model_takes), with clip layers as `clip` says, its outputs float32
    whatever the precision policy, so that the loss is computed in float32."""
    def clip_layer(name):
        return ClipGradient(clip.clip_min, clip.clip_max, clip.scale, clip.grad_scale,
                            max_norm=clip.max_norm, norm_axis=clip.norm_axis,
                            name=f"{CLIP_PREFIX}{name}")

    if m.name == "keras":
        return users_model(m, clip, input_shape, num_outputs, clip_layer)
    tap = Tap(list(clip.positions), clip_layer)
    inputs = keras.Input(input_shape, name="inputs")
    outputs = BUILDERS[m.name](m, inputs, num_outputs, tap)
    expected = OmegaConf.to_object(m).positions()
    assert tap.tapped == expected, f"{m.name} tapped {tap.tapped}, schema says {expected}"
    outputs = keras.layers.Activation("linear", dtype="float32", name="outputs")(outputs)
    return keras.Model(inputs, outputs, name=m.name)


@model("keras")
def users_builder(m: DictConfig, x, num_outputs: int, tap: Tap):
    raise AssertionError("model=keras: the user's model is built whole, by users_model")


def users_model(m: DictConfig, clip: ClipSpec, input_shape, num_outputs: int, clip_layer):
    """model=keras: the user's model with clip layers at the layers `clip.positions` names."""
    base = insertion.users_model(m, input_shape, num_outputs)
    wanted = "all" if list(clip.positions) == ["all"] else list(clip.positions)
    chosen = insertion.choose(base, wanted, m.build)
    model = insertion.with_clip_layers(
        base, chosen, lambda path: clip_layer(insertion.position_name(path)))
    if chosen and model.outputs[0].dtype != "float32":  # mixed precision: the loss in float32
        outputs = keras.layers.Activation("linear", dtype="float32", name="outputs")(
            model.outputs[0])
        model = keras.Model(model.inputs, outputs, name=model.name)
    return model


def head(model: keras.Model):
    """The output layer (AGC leaves its parameters alone): `head`, or the last layer with
    weights of a user's model."""
    names = [layer.name for layer in model.layers]
    return (model.get_layer(HEAD) if HEAD in names else
            [layer for layer in model.layers if layer.weights][-1])


def position(layer: ClipGradient) -> str:
    """Where a clip layer sits, as its columns name it: its name without `clip_`."""
    return layer.name.removeprefix(CLIP_PREFIX)


def clip_layers(model: keras.Model) -> list[ClipGradient]:
    """The model's clip layers in model order, those inside recurrent cells and nested models
    included."""
    found = []
    for layer in model.layers:
        cell = getattr(layer, "cell", None)
        if isinstance(cell, ClippedStateCell):
            found.append(cell.clip)  # inside the recurrence: before the layer's output
        if isinstance(layer, ClipGradient):
            found.append(layer)
        elif isinstance(layer, keras.Model):
            found.extend(clip_layers(layer))
    return found
