"""A model of one's own: any function (input_shape, num_outputs, **kwargs) -> Keras model."""

import keras


def two_towers(input_shape, num_outputs, width=32):
    """A Functional model: two Dense towers over the same inputs, concatenated."""
    inputs = keras.Input(input_shape)
    left = keras.layers.Dense(width, activation="relu", name="left")(inputs)
    right = keras.layers.Dense(width, activation="tanh", name="right")(inputs)
    joined = keras.layers.Concatenate(name="join")([left, right])
    hidden = keras.layers.Dense(width, activation="relu", name="mix")(joined)
    return keras.Model(inputs, keras.layers.Dense(num_outputs, name="logits")(hidden))
