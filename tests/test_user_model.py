"""model=keras: a Keras model of the user's, clip layers inserted at its layers' names."""

from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pytest

from conftest import QUICK, gradexp
from gradexp import config
from gradexp._tf import keras, tf
from gradexp.parts import insertion, models
from gradexp.parts.layers import ClipGradient

USER_MODELS = textwrap.dedent('''
    import keras

    def make(input_shape, num_outputs, width=16):
        inputs = keras.Input(input_shape)
        x = keras.layers.Dense(width, activation="relu", name="dense_a")(inputs)
        x = keras.layers.Dense(width, activation="relu", name="dense_b")(x)
        return keras.Model(inputs, keras.layers.Dense(num_outputs, name="out")(x))

    def nested(input_shape, num_outputs):
        inner = keras.Input((8,))
        block = keras.Model(inner, keras.layers.Dense(8, name="fc")(inner), name="block_2")
        inputs = keras.Input(input_shape)
        x = block(keras.layers.Dense(8, activation="relu", name="dense_1")(inputs))
        return keras.Model(inputs, keras.layers.Dense(num_outputs, name="out")(x))

    def sequential(input_shape, num_outputs):
        return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(8, name="h1"),
                                 keras.layers.Dense(num_outputs, name="logits")])

    class Subclassed(keras.Model):
        def __init__(self, n):
            super().__init__()
            self.hidden, self.out = keras.layers.Dense(8), keras.layers.Dense(n)

        def call(self, x):
            return self.out(self.hidden(x))

    def subclassed(input_shape, num_outputs):
        return Subclassed(num_outputs)

    def dropout(input_shape, num_outputs):
        inputs = keras.Input(input_shape)
        x = keras.layers.Dense(16, activation="relu", name="dense_a")(inputs)
        x = keras.layers.Dropout(0.5, seed=0, name="drop")(x)
        return keras.Model(inputs, keras.layers.Dense(num_outputs, name="out")(x))

    def named(input_shape, num_outputs):
        model = make(input_shape, num_outputs)
        return keras.Model(model.inputs, model.outputs, name="my_net")

    def not_a_model(input_shape, num_outputs):
        return "a string"

    def wrong_outputs(input_shape, num_outputs):
        return make(input_shape, num_outputs + 1)
''')


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A directory holding the user's my_models.py, as the working directory."""
    (tmp_path / "my_models.py").write_text(USER_MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "my_models", raising=False)  # each test's own file
    return tmp_path


def build(make_cfg, factory, *overrides, shape=(4,), outputs=3):
    cfg = make_cfg("model=keras", f"model.build=my_models:{factory}", *overrides)
    return models.build(cfg.model, config.clip_spec(cfg), shape, outputs)


def test_two_layer_model_forward_unchanged_and_gradient_clipped_as_by_hand(user_dir):
    """x = [1, 2] → a = x·I (dense a) → y = a·[3, -0.05]ᵀ (dense b); loss y. Backward into a:
    dy·W_b = [3, -0.05], clipped at ±0.1 → [0.1, -0.05]; so dL/dW_a = xᵀ·[0.1, -0.05]."""
    inputs = keras.Input((2,))
    hidden = keras.layers.Dense(2, use_bias=False, kernel_initializer="identity", name="a")
    head = keras.layers.Dense(1, use_bias=False, name="b")
    base = keras.Model(inputs, head(hidden(inputs)))
    head.kernel.assign([[3.0], [-0.05]])
    chosen = insertion.choose(base, ["a"], "test")
    model = insertion.with_clip_layers(base, chosen, lambda p: ClipGradient(-0.1, 0.1,
                                                                           name=f"clip_{p}"))
    assert [layer.name for layer in models.clip_layers(model)] == ["clip_a"]
    assert model.get_layer("a") is hidden and model.get_layer("b") is head  # the same weights
    x = tf.constant([[1.0, 2.0]])
    batch = tf.random.stateless_normal((64, 2), seed=(1, 2))
    np.testing.assert_array_equal(model(batch).numpy(), base(batch).numpy())  # last bit
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(model(x))
    grad_a, grad_b = tape.gradient(y, [hidden.kernel, head.kernel])
    np.testing.assert_allclose(y.numpy(), 3.0 * 1.0 - 0.05 * 2.0, rtol=1e-6)
    np.testing.assert_allclose(grad_a.numpy(), [[0.1, -0.05], [0.2, -0.1]], rtol=1e-6)
    np.testing.assert_allclose(grad_b.numpy(), [[1.0], [2.0]])  # above the clip: untouched


@pytest.mark.slow
def test_positions_by_name_and_glob_in_model_order(user_dir, make_cfg):
    model = build(make_cfg, "make", "clip=0.1")  # all: every layer with weights but the last
    assert [layer.name for layer in models.clip_layers(model)] == ["clip_dense_a", "clip_dense_b"]
    assert models.head(model).name == "out"
    model = build(make_cfg, "make", "clip=0.1", "layer.positions=[dense_b]")
    assert [layer.name for layer in models.clip_layers(model)] == ["clip_dense_b"]
    clip = models.clip_layers(model)[0]
    assert (clip.clip_min, clip.clip_max) == (-0.1, 0.1)
    model = build(make_cfg, "nested", "layer.positions=[block_2/*]")
    assert [layer.name for layer in models.clip_layers(model)] == ["clip_block_2.fc"]
    model = build(make_cfg, "sequential", "layer.positions=[h*]")
    assert [layer.name for layer in models.clip_layers(model)] == ["clip_h1"]
    x = np.ones((2, 4), np.float32)
    assert model(x).shape == (2, 3)


@pytest.mark.parametrize("factory, overrides, message", [
    ("absent", [], r"^model.build=my_models:absent: my_models has no absent$"),
    ("not_a_model", [], r"^model.build=my_models:not_a_model: returned str, not a Keras model$"),
    ("wrong_outputs", [], r"^model.build=my_models:wrong_outputs: its output has shape "
                          r"\(None, 4\); the dataset needs \(None, 3\)"),
    ("make", ["layer.positions=[conv*]"], r"^layer.positions=conv\*: matches no layer of "
                                          r"functional\w*; its layers: dense_a, dense_b, out$"),
    ("subclassed", ["layer.positions=[dense]"], r"^model.build=my_models:subclassed: returns a "
                                               r"subclassed model \(Subclassed\)"),
])
def test_bad_user_models_are_one_line(user_dir, make_cfg, factory, overrides, message):
    with pytest.raises(config.ConfigError, match=message):
        build(make_cfg, factory, *overrides)


def test_a_subclassed_model_keeps_its_own_clip_layers(user_dir, make_cfg):
    (user_dir / "my_models.py").write_text(USER_MODELS + textwrap.dedent('''
        from gradexp.layers import ClipGradient

        def with_clip(input_shape, num_outputs):
            model = Subclassed(num_outputs)
            model.clip = ClipGradient(-0.01, 0.01, name="clip_hidden")
            model.call = lambda x: model.out(model.clip(model.hidden(x)))
            return model
    '''))
    model = build(make_cfg, "with_clip")
    assert [layer.name for layer in models.clip_layers(model)] == ["clip_hidden"]


@pytest.mark.slow
def test_a_users_model_trains_from_the_command_line(user_dir):
    """Clip layers at two named layers: the run completes and logs both positions."""
    result = gradexp("gradexp.train", "model=keras", "model.build=my_models:make",
                     "model.kwargs.width=8", "clip=0.1", "layer.positions=[dense_a,dense_b]",
                     *QUICK[:-1], "hydra.run.dir=run", cwd=user_dir)
    assert result.returncode == 0, result.stderr
    summary = json.loads((user_dir / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 30
    header = (user_dir / "run" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"clip_fraction/dense_a", "clip_fraction/dense_b"} <= set(header)
    assert "param_grad_norm/dense_a" in header  # width 8: the kwargs reached the builder
    listed = gradexp("gradexp.train", "model=keras", "model.build=my_models:nested",
                     "--positions", cwd=user_dir)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()[1:]
    assert [line.split()[0] for line in lines] == ["dense_1", "block_2", "block_2/fc", "out"]
    assert [line.endswith("*") for line in lines] == [True, False, True, False]
    assert not (user_dir / "outputs").exists()  # listing writes no run


@pytest.mark.slow
def test_a_bad_model_build_from_the_command_line_is_one_line_exit_2(user_dir):
    result = gradexp("gradexp.train", "model=keras", "model.build=no_such_module:make",
                     "hydra.run.dir=run", cwd=user_dir)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: model.build=no_such_module:make: cannot import no_such_module "
        "(No module named 'no_such_module')"]
    summary = json.loads((user_dir / "run" / "summary.json").read_text())
    assert summary["status"] == "failed"  # nothing that looks like a good run


@pytest.mark.slow
def test_any_keras_optimizer_by_name_with_its_arguments(make_cfg):
    from gradexp.parts.optimizers import make_optimizer

    cfg = make_cfg("optimizer=keras", "optimizer.class_name=Lion",
                   "optimizer.learning_rate=0.01", "optimizer.kwargs.beta_1=0.95")
    made = make_optimizer(cfg.optimizer, "float32")
    assert type(made) is keras.optimizers.Lion
    assert (made.beta_1, float(made.learning_rate)) == (0.95, np.float32(0.01))
    for overrides, message in [
            (["optimizer.class_name=Nope"], r"^optimizer.class_name=Nope: no such Keras "
                                            r"optimizer; choose one of Adadelta, .*Lion, "),
            (["optimizer.class_name=Lion", "optimizer.kwargs.bogus=1"],
             r"^optimizer.kwargs: Lion refused them \(Argument\(s\) not recognized"),
            (["optimizer.class_name=os.path:join"], r"^optimizer.kwargs: os.path:join refused")]:
        cfg = make_cfg("optimizer=keras", *overrides)
        with pytest.raises(config.ConfigError, match=message):
            make_optimizer(cfg.optimizer, "float32")


@pytest.mark.slow
def test_a_keras_loss_by_name_or_path_and_one_loss_per_example(user_dir, make_cfg):
    """huber (δ = 1) of y = 0, ŷ = 2: δ·(|e| − δ/2) = 1.5; of ŷ = 0.5: e²/2 = 0.125."""
    from gradexp.training.step import check_loss, task_loss

    huber = task_loss(None, "huber")
    np.testing.assert_allclose(huber(np.zeros((2, 1)), np.array([[2.0], [0.5]])), [1.5, 0.125])
    (user_dir / "my_losses.py").write_text("def cube(y, out):\n    return (out[:, 0] - y) ** 3\n")
    for path in ("my_losses:cube", "my_losses.cube"):  # either form of a dotted path
        assert task_loss(None, path)(np.zeros(1), np.array([[2.0]]))[0] == 8.0
    with pytest.raises(config.ConfigError, match=r"^model.loss=my_losses:square: my_losses has "
                                                 r"no square$"):
        task_loss(None, "my_losses:square")
    with pytest.raises(config.ConfigError, match=r"^model.loss=nope: no such Keras loss; give a "
                                                 r"Keras loss function's name \(e.g. huber\) or "
                                                 r"a dotted path$"):
        task_loss(None, "nope")
    from gradexp.parts import data

    cfg = make_cfg("model=keras", "model.build=my_models:make")
    arrays = data.load(cfg.dataset)
    model = build(make_cfg, "make", shape=arrays.input_shape, outputs=arrays.num_outputs)
    check_loss(task_loss(arrays.num_classes), model, arrays, "auto")  # the default: one each
    with pytest.raises(config.ConfigError, match=r"^model.loss=mse: must give one loss per "
                                                 r"example \(shape \(2,\) for 2 examples\)"):
        check_loss(lambda y, out: tf.reduce_mean(out), model, arrays, "mse")

    def refuses(y, out):  # a loss that cannot take the model's outputs: its own first line
        raise ValueError("Dimensions must be equal, but are 10 and 3\nthe traceback's rest")

    with pytest.raises(config.ConfigError, match=r"^model.loss=mine: .* for 2 examples\); got "
                                                 r"Dimensions must be equal, but are 10 and 3$"):
        check_loss(refuses, model, arrays, "mine")


@pytest.mark.slow
def test_the_step_trains_on_the_configured_loss(user_dir, make_cfg):
    """model.loss reaches the step: its validation loss is the Keras loss's mean over the
    validation set; a loss of the wrong shape stops make_step in one line."""
    from gradexp.parts import data
    from gradexp.training.step import make_step

    (user_dir / "scalar_loss.py").write_text(  # a module name no other test imports
        "import keras\n\ndef total(y, out):\n    return keras.ops.sum(out)\n")
    base = ["model=keras", "model.build=my_models:make", "model.kwargs.width=4", "dataset=teacher"]
    cfg = make_cfg(*base, "model.loss=huber")
    arrays = data.load(cfg.dataset)
    step = make_step(cfg, arrays)
    x_val, y_val = data.validation_set(arrays)
    values = [tf.convert_to_tensor(v) for v in step.model.variables]
    expected = np.mean(keras.losses.huber(y_val[:, None], step.model(x_val)))
    assert float(step.evaluate(values, x_val, y_val)["loss/val"]) == pytest.approx(expected,
                                                                                rel=1e-5)
    squared = np.mean((step.model(x_val)[:, 0] - y_val) ** 2)  # the default: not this one
    assert abs(expected - squared) > 1e-3
    with pytest.raises(config.ConfigError, match=r"^model.loss=scalar_loss:total: must give "
                                                 r"one loss per example"):
        make_step(make_cfg(*base, "model.loss=scalar_loss:total"), arrays)


def test_the_step_trains_in_training_mode_and_evaluates_in_inference_mode(user_dir, make_cfg):
    """A Dropout layer of the user's model drops units in the step's forward pass and none in
    its evaluation: on the same weights and examples, the step's mean loss is not the
    evaluation's, and the evaluation's is the model's own in inference mode."""
    from gradexp.parts import data
    from gradexp.training.step import State, make_step

    keras.utils.set_random_seed(0)  # the weights, whatever ran before
    cfg = make_cfg("model=keras", "model.build=my_models:dropout", "dataset=teacher")
    arrays = data.load(cfg.dataset)
    step = make_step(cfg, arrays)
    x_val, y_val = data.validation_set(arrays)
    x, y = x_val[:64], y_val[:64]
    state = State([tf.convert_to_tensor(v) for v in step.model.variables],
                  [tf.convert_to_tensor(v) for v in step.optimizer.variables],
                  step.initial_carry())
    evaluated = float(step.evaluate(state.model, x, y)["loss/val"])
    inference = float(np.mean((step.model(x, training=False)[:, 0] - y) ** 2))
    assert evaluated == pytest.approx(inference, rel=1e-5)
    trained = float(step.backward(state, x, y).loss_sum) / len(x)
    assert abs(trained - inference) > 0.01 * inference


def test_a_users_model_with_clip_layers_under_mixed_precision_ends_in_float32(user_dir,
                                                                             make_cfg):
    """Mixed precision: the clip layers' model gets a float32 `outputs` layer, so the loss is
    computed in float32; with no clip layer the user's model is left as it is."""
    keras.config.set_dtype_policy("mixed_float16")  # (undone after the test: conftest)
    clipped = build(make_cfg, "named", "clip=0.1", "layer.positions=[dense_a]")
    assert clipped.layers[-1].name == "outputs" and clipped.outputs[0].dtype == "float32"
    assert clipped.name == "my_net"  # the user's model's name kept
    assert clipped.get_layer("out").compute_dtype == "float16"
    plain = build(make_cfg, "make", "layer.positions=[]")
    assert plain.layers[-1].name == "out" and plain.outputs[0].dtype == "float16"
    keras.config.set_dtype_policy("float32")  # already float32 at the end: nothing added
    single = build(make_cfg, "make", "clip=0.1", "layer.positions=[dense_a]")
    assert single.layers[-1].name == "out" and single.outputs[0].dtype == "float32"
