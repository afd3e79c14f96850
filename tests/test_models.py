"""Every model on every dataset it can take (short real runs), the one-line refusal otherwise, and
the clip layer inside the recurrence of an RNN, checked against a loop unrolled by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gradexp import config
from gradexp._tf import tf
from gradexp.parts import models
from gradexp.parts.layers import STATS, clip_gradient
from gradexp.train import train
from gradexp.training import telemetry
from gradexp.training.step import metric_names

TINY_MODELS = {
    "mlp": ["model.depth=2", "model.width=8"],
    "cnn": ["model.filters=4", "model.width=8"],
    "rnn": ["model.cell=lstm", "model.units=8", "model.layers=2"],
    "transformer": ["model.blocks=1", "model.width=8", "model.mlp_width=8"],
}
SMALL_DATASETS = {
    "synthetic": ["dataset.num_examples=160"],  # classification, vectors (32,)
    "teacher": ["dataset.num_examples=160"],  # regression, vectors (32,)
    "adding": ["dataset.num_examples=160", "dataset.length=12"],  # regression, sequences (12, 2)
    "digits": [],  # classification, images (8, 8, 1)
}
FEW_STEPS = ["trainer.steps=4", "trainer.log_every=2", "trainer.eval_every=4",
             "trainer.histogram_every=0", "trainer.batch_size=16", "clip=0.1"]
REGRESSION = {"teacher", "adding"}
TAKES = {"mlp": {"synthetic", "teacher", "adding", "digits"}, "cnn": {"adding", "digits"},
         "rnn": {"adding", "digits"}, "transformer": {"adding", "digits"}}
NEEDS = {"cnn": "image inputs (H, W, C) or sequences (T, F), convolved along T",
         "rnn": "sequence inputs (T, F) or images (H, W, C), read row by row",
         "transformer": "sequence inputs (T, F) or images (H, W, C), read row by row"}
SHAPES = {"synthetic": "vectors (32,)", "teacher": "vectors (32,)", "adding": "sequences (12, 2)"}


def short_run(make_cfg, run_dir, model, dataset, *overrides):
    cfg = make_cfg(f"model={model}", f"dataset={dataset}", *TINY_MODELS[model],
                   *SMALL_DATASETS[dataset], *FEW_STEPS, *overrides)
    config.validate(cfg)
    summary = train(cfg, run_dir)
    return summary, pd.read_csv(run_dir / "metrics.csv")


def assert_trained(summary, table, dataset, positions):
    assert summary["status"] == "completed"
    # the clip layers' measurements, then the telemetry of every layer with weights, the head last
    layers = list(dict.fromkeys(c.split("/")[1] for c in table.columns
                                if c.startswith("update_norm/")))
    assert layers[-1] == "head" and len(layers) >= 2
    assert list(table.columns) == ["step", *metric_names(positions),
                                   *telemetry.metric_names(layers), "loss/val", "accuracy/val"]
    assert len(table) == 4 and np.isfinite(table["loss/train"]).all()
    assert np.isfinite(table["loss/val"].iloc[-1])
    if dataset in REGRESSION:  # squared error; no accuracy
        assert table["accuracy/val"].isna().all() and np.isnan(summary["val_accuracy"])
    else:
        assert 0 <= table["accuracy/val"].iloc[-1] <= 1


@pytest.mark.slow
@pytest.mark.parametrize("dataset", SMALL_DATASETS)
@pytest.mark.parametrize("model", TINY_MODELS)
def test_model_trains_with_a_clip_at_every_position_or_is_refused(make_cfg, tmp_path, model,
                                                                  dataset):
    if dataset not in TAKES[model]:
        cfg = make_cfg(f"model={model}", f"dataset={dataset}", *SMALL_DATASETS[dataset])
        expected = f"model={model}: needs {NEEDS[model]}; dataset={dataset} gives {SHAPES[dataset]}"
        with pytest.raises(config.ConfigError) as early:  # from the config, before TensorFlow
            config.validate(cfg)
        assert str(early.value) == expected
        with pytest.raises(config.ConfigError) as late:  # from the arrays' actual shape
            train(cfg, tmp_path)
        assert str(late.value) == expected
        return
    summary, table = short_run(make_cfg, tmp_path, model, dataset, "layer.positions=all")
    positions = config.positions(make_cfg(f"model={model}", *TINY_MODELS[model]))
    assert_trained(summary, table, dataset, positions)


@pytest.mark.slow
@pytest.mark.parametrize(("cell", "gates"), [("simple", 1), ("gru", 3)])
def test_the_simple_and_gru_cells_train(make_cfg, tmp_path, cell, gates):
    """model.cell=simple and gru in a real run (the grid above trains LSTMs), clipped at every
    position; the weights the run trained (its checkpoint) are that cell's: kernels of
    gates × units columns (an LSTM's would have 4 × units)."""
    summary, table = short_run(make_cfg, tmp_path, "rnn", "adding", f"model.cell={cell}",
                               "layer.positions=all")
    positions = config.positions(make_cfg("model=rnn", *TINY_MODELS["rnn"]))
    assert_trained(summary, table, "adding", positions)
    assert (table[[f"clip_fraction/{p}" for p in positions]].to_numpy() > 0).any()
    shapes = {tuple(shape) for name, shape in tf.train.list_variables(str(tmp_path / "checkpoints"))
              if name.startswith("optimizer/_trainable_variables/") and len(shape) == 2}
    units, features = 8, 2
    assert {(features, gates * units), (units, gates * units)} <= shapes, shapes
    assert not {(units, k * units) for k in {1, 3, 4} - {gates}} & shapes, shapes


ONE_POSITION = {"mlp": ("teacher", "dense_2"), "cnn": ("digits", "conv_2"),
                "rnn": ("adding", "rnn_2_state"), "transformer": ("adding", "attn_1")}


@pytest.mark.slow
@pytest.mark.parametrize("model", ONE_POSITION)
def test_model_trains_with_a_clip_at_one_named_position(make_cfg, tmp_path, model):
    dataset, position = ONE_POSITION[model]
    summary, table = short_run(make_cfg, tmp_path, model, dataset,
                               f"layer.positions=[{position}]", "clip=0.001")
    assert_trained(summary, table, dataset, [position])
    assert (table[f"clip_fraction/{position}"] > 0).all()  # a tight bound bites at once
    pre, post = table[f"grad_norm/{position}/pre"], table[f"grad_norm/{position}/post"]
    assert (post < pre).all()


def test_positions_are_named_in_model_order(make_cfg):
    def names(*overrides):
        return config.positions(make_cfg(*overrides))

    assert names("model=cnn", "model.blocks=3") == ["conv_1", "conv_2", "conv_3", "dense_1"]
    assert names("model=rnn", "model.layers=2") == ["rnn_1_state", "rnn_1", "rnn_2_state", "rnn_2"]
    assert names("model=transformer") == ["embed", "attn_1", "mlp_1", "attn_2", "mlp_2"]


@pytest.mark.parametrize(("overrides", "message"), [
    (["model=rnn", "model.cell=elman"], "model.cell=elman: must be one of simple, lstm, gru"),
    (["model=transformer", "model.width=10", "model.heads=4"],
     "model.width=10: must be a multiple of heads (4)"),
    (["model=transformer", "model.norm=sandwich"], "model.norm=sandwich: must be one of pre, post"),
    (["model=cnn", "dataset=digits", "layer.positions=[conv_3]"],
     "layer.positions=conv_3: no such position in model=cnn; allowed: all, or a list of "
     "conv_1, conv_2, dense_1"),
    (["dataset=adding", "dataset.length=1"], "dataset.length=1: must be an integer >= 2"),
])
def test_bad_model_and_dataset_values_are_one_line(make_cfg, overrides, message):
    with pytest.raises(config.ConfigError, match="^" + message.replace("(", r"\(")
                       .replace(")", r"\)") + "$"):
        config.validate(make_cfg(*overrides))


# ------------------------------------------------------------------ clip inside the recurrence
BATCH, STEPS, FEATURES, UNITS, BOUND = 3, 6, 2, 4, 0.01


def two_layer_rnn(make_cfg, cell, position):
    """rnn_1 (whose outputs at every step feed rnn_2), rnn_2, head; a clip at `position`."""
    cfg = make_cfg("model=rnn", f"model.cell={cell}", f"model.units={UNITS}", "model.layers=2",
                   "dataset=adding", f"dataset.length={STEPS}", f"clip={BOUND}",
                   f"layer.positions=[{position}]")
    return models.build(cfg.model, config.clip_spec(cfg), (STEPS, FEATURES), 1)


def by_hand(model, x, where: str | None):
    """d loss / d x and the clip statistics, with rnn_1's recurrence as a Python loop over time:
    where="state": h_t = clip(cell(x_t, state_{t-1}).h) at every step; where="output": the
    sequence of h_t is clipped after the loop (what position rnn_1 does); None: no clip."""
    cell = model.get_layer("rnn_1").cell
    cell = getattr(cell, "cell", cell)  # the Keras cell inside gradexp's wrapper
    stats = tf.zeros([len(STATS)])
    with tf.GradientTape() as tape:
        tape.watch([x, stats])
        states, outputs = cell.get_initial_state(BATCH), []
        for t in range(STEPS):
            h, states = cell(x[:, t], states)
            if where == "state":
                h = clip_gradient(h, -BOUND, BOUND, 1.0, 1.0, stats=stats)
            states = [h, *states[1:]]
            outputs.append(h)
        sequence = tf.stack(outputs, axis=1)
        if where == "output":
            sequence = clip_gradient(sequence, -BOUND, BOUND, 1.0, 1.0, stats=stats)
        prediction = model.get_layer("head")(model.get_layer("rnn_2")(sequence))
        loss = tf.reduce_sum(prediction * 10.0)
    return tape.gradient(loss, [x, stats])


def through_gradexp(model, x):
    """d loss / d x and the statistics of the model's one clip layer, in a tf.function as in
    training (Keras then runs the recurrence in a tf.while_loop)."""
    (clip,) = models.clip_layers(model)
    probe = clip.gradient_stats.value

    @tf.function
    def gradients():
        with tf.GradientTape() as tape:
            tape.watch([x, probe])
            loss = tf.reduce_sum(model(x) * 10.0)
        return tape.gradient(loss, [x, probe])

    return gradients()


def sequences(seed):
    return tf.constant(np.random.default_rng(seed).normal(size=(BATCH, STEPS, FEATURES)),
                       tf.float32)


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["simple", "lstm", "gru"])
def test_state_clip_acts_at_every_time_step(make_cfg, cell):
    model, x = two_layer_rnn(make_cfg, cell, "rnn_1_state"), sequences(0)
    assert [c.name for c in models.clip_layers(model)] == ["clip_rnn_1_state"]
    dx, stats = through_gradexp(model, x)
    dx_by_hand, stats_by_hand = by_hand(model, x, "state")
    np.testing.assert_allclose(dx, dx_by_hand, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(stats, stats_by_hand, rtol=1e-5)
    stats = dict(zip(STATS, stats.numpy(), strict=True))
    assert stats["count"] == BATCH * STEPS * UNITS  # the statistics add up over the time steps
    assert stats["clipped"] > BATCH * UNITS  # it bites at more than one step
    # not the same as clipping the layer's outputs only, nor as no clip at all
    dx_output_only, _ = by_hand(model, x, "output")
    dx_unclipped, _ = by_hand(model, x, None)
    assert np.abs(dx - dx_output_only).max() > 0.05 * np.abs(dx_output_only).max()
    assert np.abs(dx - dx_unclipped).max() > 0.05 * np.abs(dx_unclipped).max()


@pytest.mark.slow
def test_output_clip_is_the_output_sequence_only(make_cfg):
    model, x = two_layer_rnn(make_cfg, "simple", "rnn_1"), sequences(1)
    dx, stats = through_gradexp(model, x)
    dx_by_hand, stats_by_hand = by_hand(model, x, "output")
    np.testing.assert_allclose(dx, dx_by_hand, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(stats, stats_by_hand, rtol=1e-5)


@pytest.mark.slow
def test_rnn_with_state_clip_survives_save_and_load(make_cfg, tmp_path):
    from gradexp._tf import keras

    model = two_layer_rnn(make_cfg, "gru", "rnn_1_state")
    model.save(tmp_path / "rnn.keras")
    reloaded = keras.models.load_model(tmp_path / "rnn.keras")
    own = [{k: v for k, v in m.get_layer("rnn_1").cell.get_config().items()
            if k not in ("cell", "clip")} for m in (model, reloaded)]
    assert own[1] == own[0] and own[0]["name"]  # the wrapper's own settings (its name) too
    x = sequences(2)
    np.testing.assert_allclose(model(x).numpy(), reloaded(x).numpy(), rtol=1e-6)
    np.testing.assert_allclose(through_gradexp(model, x)[0].numpy(),
                               through_gradexp(reloaded, x)[0].numpy(), rtol=1e-6)


def test_pascanu_initialisation_is_sparse_with_the_spectral_radius_asked(make_cfg):
    """model.init=pascanu2013 (pascanur/trainingRNNs "smart_tanh"): 15 non-zeros per row of the
    recurrent matrix, scaled to spectral radius recurrent_gain; inputs and output N(0, 0.01²)."""
    from gradexp._tf import keras

    cfg = make_cfg("model=rnn", "model.units=50", "model.init=pascanu2013",
                   "model.recurrent_gain=0.95", "dataset=adding", "layer.positions=[]")
    keras.utils.set_random_seed(0)
    model = models.build(cfg.model, config.clip_spec(cfg), (50, 2), 1)
    cell = model.get_layer("rnn_1").cell
    w = np.asarray(cell.recurrent_kernel)
    assert ((w != 0).sum(axis=1) == 15).all()
    assert np.max(np.abs(np.linalg.eigvals(w))) == pytest.approx(0.95, rel=1e-5)
    # each non-zero drawn on its own from a normal around 0: distinct in a row, of both signs
    assert all(len(set(row[row != 0])) == 15 for row in w)
    assert 0.4 < (w[w != 0] > 0).mean() < 0.6  # 750 draws: 0.5 ± 0.018 (one σ)
    for kernel in (np.asarray(cell.kernel), np.asarray(model.get_layer("head").kernel)):
        assert 0.005 < kernel.std() < 0.02  # N(0, 0.01²), not Glorot's ~0.3


def test_rnn_readout_all_feeds_every_step_to_the_head(make_cfg):
    """model.readout=all (MNIST-1D's GRU): the head reads the outputs of all T steps, flattened;
    its logits equal head(flatten(h_1..h_T)) computed from the RNN's own sequence."""
    from gradexp._tf import keras

    cfg = make_cfg("model=rnn", "model.cell=gru", "model.units=6", "model.readout=all",
                   "dataset=adding", "dataset.length=7", "layer.positions=[rnn_1]", "clip=0.1")
    keras.utils.set_random_seed(0)
    model = models.build(cfg.model, config.clip_spec(cfg), (7, 2), 3)
    head = model.get_layer("head")
    assert head.kernel.shape == (7 * 6, 3)
    x = np.random.default_rng(0).normal(size=(4, 7, 2)).astype("float32")
    states = model.get_layer("rnn_1")(x)  # (4, 7, 6): every step
    by_hand = states.numpy().reshape(4, -1) @ head.kernel.numpy() + head.bias.numpy()
    np.testing.assert_allclose(model(x).numpy(), by_hand, rtol=1e-5, atol=1e-6)
    last = models.build(make_cfg("model=rnn", "model.cell=gru", "model.units=6",
                                 "dataset=adding").model, config.clip_spec(cfg), (7, 2), 3)
    assert last.get_layer("head").kernel.shape == (6, 3)  # readout=last: the final state only


def shapes(model) -> dict[str, list[tuple[int, ...]]]:
    """{layer name: the shapes of its trainable weights} of the layers that have any (a clip
    layer's statistics are not trained)."""
    return {layer.name: [tuple(w.shape) for w in layer.trainable_weights]
            for layer in model.layers if layer.trainable_weights}


@pytest.mark.parametrize(("overrides", "input_shape", "expected"), [
    # Dense: kernel (inputs, units) and bias (units,); the head has 3 outputs
    (["model=mlp", "model.depth=2", "model.width=8"], (4,),
     {"dense_1": [(4, 8), (8,)], "dense_2": [(8, 8), (8,)], "head": [(8, 3), (3,)]}),
    # conv_i has filters·2^(i-1) filters of kernel_size²·channels; two same-padded 2×2 pools:
    # 8×8 → 4×4 → 2×2, so dense_1 reads 2·2·8 = 32 values
    (["model=cnn", "model.filters=4", "model.kernel_size=3", "model.width=8"], (8, 8, 1),
     {"conv_1": [(3, 3, 1, 4), (4,)], "conv_2": [(3, 3, 4, 8), (8,)], "dense_1": [(32, 8), (8,)],
      "head": [(8, 3), (3,)]}),
    # a sequence (T=9, F=2): 1-D convolutions along T, 9 → 5 → 3 steps (same padding)
    (["model=cnn", "model.filters=4", "model.kernel_size=5", "model.width=8", "model.blocks=2"],
     (9, 2), {"conv_1": [(5, 2, 4), (4,)], "conv_2": [(5, 4, 8), (8,)],
              "dense_1": [(3 * 8, 8), (8,)], "head": [(8, 3), (3,)]}),
    # an LSTM cell: 4 gates of `units`; the second layer reads the first's sequence; an image
    # (6, 5, 1) is read row by row: 6 steps of 5 features
    (["model=rnn", "model.cell=lstm", "model.units=8", "model.layers=2"], (6, 5, 1),
     {"rnn_1": [(5, 32), (8, 32), (32,)], "rnn_2": [(8, 32), (8, 32), (32,)],
      "head": [(8, 3), (3,)]}),
    # a GRU cell: 3 gates, Keras's reset_after: two biases each
    (["model=rnn", "model.cell=gru", "model.units=4"], (7, 2),
     {"rnn_1": [(2, 12), (4, 12), (2, 12)], "head": [(4, 3), (3,)]}),
    (["model=rnn", "model.cell=simple", "model.units=4"], (7, 2),
     {"rnn_1": [(2, 4), (4, 4), (4,)], "head": [(4, 3), (3,)]}),
    # the transformer: embed, a (T, width) position matrix, per block attention (heads ×
    # width/heads per query, key and value, and the output back to width), an MLP, two norms
    (["model=transformer", "model.blocks=1", "model.width=8", "model.heads=2",
      "model.mlp_width=16"], (5, 3),
     {"embed": [(3, 8), (8,)], "position": [(5, 8)],
      "attn_1_norm": [(8,), (8,)], "attn_1": [(8, 2, 4), (2, 4), (8, 2, 4), (2, 4), (8, 2, 4),
                                              (2, 4), (2, 4, 8), (8,)],
      "mlp_1_norm": [(8,), (8,)], "mlp_1_in": [(8, 16), (16,)], "mlp_1_out": [(16, 8), (8,)],
      "final_norm": [(8,), (8,)], "head": [(8, 3), (3,)]}),
])
def test_each_models_layers_have_the_shapes_worked_out_by_hand(make_cfg, overrides, input_shape,
                                                               expected):
    cfg = make_cfg(*overrides)
    model = models.build(cfg.model, config.clip_spec(cfg), input_shape, 3)
    assert shapes(model) == expected


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_the_hidden_layers_take_the_configured_activation_and_initializer(make_cfg, name):
    cfg = make_cfg(f"model={name}", "model.activation=tanh", "model.initializer=lecun_normal",
                   "model.width=8")
    model = models.build(cfg.model, config.clip_spec(cfg), (8, 8, 1), 3)
    hidden = [layer for layer in model.layers if layer.name.startswith(("dense_", "conv_"))]
    assert hidden and {layer.activation.__name__ for layer in hidden} == {"tanh"}
    assert model.get_layer("head").activation.__name__ == "linear"
    assert {type(layer.kernel_initializer).__name__ for layer in [*hidden, model.get_layer(
        "head")]} == {"LecunNormal"}


def made_by(layer) -> str:
    """The name of the layer whose output `layer` takes as its input."""
    return layer.input._keras_history.operation.name


def test_post_norm_normalises_each_residual_sum_and_pre_norm_each_branch_input(make_cfg):
    """norm=post: LN(x + f(x)), each norm reads its block's sum and no final norm; norm=pre:
    x + f(LN(x)), each norm reads the stream and a final norm comes before pooling."""
    built = {}
    for norm in ("pre", "post"):
        cfg = make_cfg("model=transformer", "model.blocks=1", "model.width=8", "model.heads=2",
                       "model.mlp_width=16", f"model.norm={norm}")
        built[norm] = models.build(cfg.model, config.clip_spec(cfg), (5, 3), 3)
    post, pre = built["post"], built["pre"]
    assert made_by(post.get_layer("attn_1_norm")) == "attn_1_add"
    assert made_by(post.get_layer("mlp_1_norm")) == "mlp_1_add"
    assert made_by(post.get_layer("mlp_1_in")) == "attn_1_norm"
    assert made_by(post.get_layer("pool")) == "mlp_1_norm"
    assert "final_norm" not in [layer.name for layer in post.layers]
    assert made_by(pre.get_layer("attn_1_norm")) == "clip_embed"
    assert made_by(pre.get_layer("mlp_1_norm")) == "attn_1_add"
    assert made_by(pre.get_layer("pool")) == "final_norm"


def test_the_sparse_spectral_initializer_round_trips_its_config():
    """What Keras saves of model.init=pascanu2013's recurrent initializer builds it again."""
    init = models.SparseSpectral(0.95, connections=7)
    assert init.get_config() == {"radius": 0.95, "connections": 7}
    again = models.SparseSpectral.from_config(init.get_config())
    w = again((20, 20))
    assert w.dtype == "float32"  # Keras's default, when the caller names no dtype
    w = np.asarray(w)
    assert ((w != 0).sum(axis=1) == 7).all()
    assert np.max(np.abs(np.linalg.eigvals(w))) == pytest.approx(0.95, rel=1e-5)


def test_the_position_matrix_is_a_learned_weight_drawn_from_a_narrow_normal(make_cfg):
    """P of x + P: one trainable weight, `embeddings`, of shape (T, width), drawn from
    N(0, 0.02²) (GPT-2's), not Keras's default Glorot (σ ≈ 0.17 for (50, 16))."""
    from gradexp._tf import keras

    cfg = make_cfg("model=transformer", "model.blocks=1", "model.width=16", "model.heads=2",
                   "model.mlp_width=16")
    keras.utils.set_random_seed(0)
    model = models.build(cfg.model, config.clip_spec(cfg), (50, 3), 3)
    (weight,) = model.get_layer("position").trainable_weights
    assert weight.name == "embeddings" and tuple(weight.shape) == (50, 16)
    p = np.asarray(weight)
    assert 0.018 < p.std() < 0.022 and abs(p.mean()) < 0.003  # 800 draws: σ's error ~2.5 %
    x = np.arange(2 * 50 * 16, dtype=np.float32).reshape(2, 50, 16)
    np.testing.assert_array_equal(model.get_layer("position")(x), x + p)  # added, to each


def test_an_image_read_by_an_rnn_is_reshaped_into_rows_by_a_named_layer(make_cfg):
    """(8, 8, 1) images read row by row: a `rows` layer makes them 8 steps of 8 features."""
    cfg = make_cfg("model=rnn", "model.units=4", "dataset=digits", "layer.positions=[]")
    model = models.build(cfg.model, config.clip_spec(cfg), (8, 8, 1), 10)
    assert [layer.name for layer in model.layers] == ["inputs", "rows", "rnn_1", "head",
                                                      "outputs"]
    assert tuple(model.get_layer("rows").output.shape) == (None, 8, 8)
    assert model.name == "rnn"  # the model's own name, as its config says


def test_the_head_is_the_layer_named_head_or_else_the_last_with_weights():
    """AGC leaves the output layer's parameters alone: the layer named `head` wherever it sits,
    or in a model without one (a user's) the last layer that has weights."""
    from gradexp._tf import keras

    def model(*names):
        inputs = keras.Input((3,))
        x = inputs
        for name in names:
            x = keras.layers.Dense(2, name=name)(x)
        return keras.Model(inputs, keras.layers.Activation("relu", name="act")(x))

    assert models.head(model("a", "head", "b")).name == "head"
    assert models.head(model("a", "b")).name == "b"


def test_under_mixed_precision_a_models_layers_compute_in_float16_and_it_ends_in_float32(
        make_cfg):
    """The loss is computed in float32 whatever the policy: the `outputs` layer casts."""
    from gradexp._tf import keras

    keras.config.set_dtype_policy("mixed_float16")  # (undone after the test: conftest)
    cfg = make_cfg("model=mlp", "model.depth=1", "model.width=4")
    model = models.build(cfg.model, config.clip_spec(cfg), (3,), 2)
    assert model.get_layer("head").compute_dtype == "float16"
    assert model.layers[-1].name == "outputs" and model.outputs[0].dtype == "float32"
