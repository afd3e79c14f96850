"""The MNIST-1D paper's four models (Greydanus 2020; greydanus/mnist1d notebooks/models.py),
written as a user writes a model for gradexp: functions (input_shape, num_outputs) -> Keras
model, used as `model=keras model.build=paper_models:<name>` from this folder.

    logistic   LinearBase: one linear layer on the 40 inputs                   410 parameters
    mlp        MLPBase: h1 = relu(W1 x), h2 = h1 + relu(W2 h1), out = W3 h2   15,210 (width 100)
    cnn        ConvBase: three Conv1D of 25 channels, stride 2 (kernel 5, 3, 3, padding 1),
               relu, flattened (5 × 25 = 125), one linear layer              5,210
    gru        GRUBase: a bidirectional GRU of 6 units each way over the 40 steps, every
               step's output flattened (40 × 12), one linear layer          5,134

The parameter counts are PyTorch's for the same models (tests/test_mnist1d_models.py checks
them); Keras's GRU (reset_after=True) has PyTorch's two bias vectors. The layers are named, so
clip layers go at `layer.positions=[conv_*]`, `[hidden_*]` or `[gru]`.
"""

import keras


def as_sequence(x, input_shape):
    """(40,) or (40, 1) inputs as a sequence of 40 steps of one feature."""
    return keras.layers.Reshape((input_shape[0], 1), name="as_sequence")(x)


def logistic(input_shape, num_outputs):
    inputs = keras.Input(input_shape)
    x = keras.layers.Flatten(name="flatten")(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_outputs, name="linear")(x),
                       name="logistic")


def mlp(input_shape, num_outputs, width=100):
    inputs = keras.Input(input_shape)
    x = keras.layers.Flatten(name="flatten")(inputs)
    h1 = keras.layers.Dense(width, activation="relu", name="hidden_1")(x)
    h2 = keras.layers.Add(name="residual")(
        [h1, keras.layers.Dense(width, activation="relu", name="hidden_2")(h1)])
    return keras.Model(inputs, keras.layers.Dense(num_outputs, name="linear")(h2), name="mlp")


def cnn(input_shape, num_outputs, channels=25):
    inputs = keras.Input(input_shape)
    x = as_sequence(inputs, input_shape)
    for i, kernel in enumerate((5, 3, 3), start=1):
        x = keras.layers.ZeroPadding1D(1, name=f"pad_{i}")(x)
        x = keras.layers.Conv1D(channels, kernel, strides=2, activation="relu",
                                name=f"conv_{i}")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    return keras.Model(inputs, keras.layers.Dense(num_outputs, name="linear")(x), name="cnn")


def gru(input_shape, num_outputs, units=6):
    inputs = keras.Input(input_shape)
    x = keras.layers.Bidirectional(keras.layers.GRU(units, return_sequences=True),
                                   name="gru")(as_sequence(inputs, input_shape))
    x = keras.layers.Flatten(name="flatten")(x)
    return keras.Model(inputs, keras.layers.Dense(num_outputs, name="linear")(x), name="gru")
