"""Any data: a user's loader (dataset=arrays), trained on through the command line as a user
would, and each bad input answered in one line before anything trains."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from conftest import gradexp
from gradexp import config, data, external_data
from gradexp.config import ConfigError
from gradexp.train import train

# The user's module, written beside where gradexp runs. 40 examples are held out.
USER_MODULE = '''
import numpy as np


def load(n=100, classes=7, regression=False):
    """n training examples of shape (5, 3): class labels in [0, classes), or float targets."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n + 40, 5, 3))
    y = rng.normal(size=n + 40) if regression else rng.integers(0, classes, n + 40)
    return (x[:n], y[:n]), (x[n:], y[n:])


def as_datasets(n=100):
    import tensorflow as tf

    return tuple(tf.data.Dataset.from_tensor_slices(part) for part in load(n))


def batched(n=100):
    return tuple(ds.batch(10) for ds in as_datasets(n))


def vectors(n=100):
    (x, y), (x_val, y_val) = load(n)
    return (x[:, :, 0], y), (x_val[:, :, 0], y_val)


def three_parts():
    return load() + (None,)
'''
SHORT = ["trainer.steps=20", "trainer.log_every=10", "trainer.eval_every=20",
         "trainer.histogram_every=0", "trainer.batch_size=16", "model.width=8"]
SMALL_MLP = ["model.depth=1"]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """my_data.py in tmp_path, importable here too (forgotten again afterwards)."""
    (tmp_path / "my_data.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_data", raising=False)
    yield tmp_path
    sys.modules.pop("my_data", None)


def loaded(make_cfg, *overrides):
    return data.load(make_cfg("dataset=arrays", *overrides).dataset)


def summary_of(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


# ------------------------------------------------------------------------------ dataset=arrays
def test_a_users_loader_trains_from_the_command_line(user_module):
    result = gradexp("gradexp.train", "dataset=arrays", "dataset.load=my_data:load",
                     "dataset.kwargs.n=300", *SHORT, *SMALL_MLP, "hydra.run.dir=run",
                     cwd=user_module)
    assert result.returncode == 0, result.stderr
    summary = summary_of(user_module / "run")
    assert summary["status"] == "completed" and summary["steps"] == 20
    assert summary["data"] == {"input_shape": [5, 3], "num_classes": 7,  # the user's arrays
                               "train_examples": 300, "val_examples": 40}
    assert 0 <= summary["val_accuracy"] <= 1
    assert summary["config"]["dataset"]["kwargs"] == {"n": 300}
    assert "training mlp on arrays" in (user_module / "run" / "train.log").read_text()


def test_a_loader_of_float_targets_gives_a_regression_run(make_cfg, user_module):
    cfg = make_cfg("dataset=arrays", "dataset.load=my_data:load", "dataset.kwargs.n=120",
                   "dataset.kwargs.regression=true", *SHORT, *SMALL_MLP)
    config.validate(cfg)
    summary = train(cfg, user_module)
    assert summary["status"] == "completed"
    assert summary["data"] == {"input_shape": [5, 3], "num_classes": None,
                               "train_examples": 120, "val_examples": 40}
    assert np.isnan(summary["val_accuracy"]) and np.isfinite(summary["val_loss"])


def test_numpy_arrays_and_datasets_give_the_same_typed_arrays(make_cfg, user_module):
    from my_data import load

    (x_train, y_train), (x_val, y_val) = load(60)
    for loader in ("load", "as_datasets"):
        a = loaded(make_cfg, f"dataset.load=my_data:{loader}", "dataset.kwargs.n=60")
        np.testing.assert_array_equal(a.x_train, x_train.astype(np.float32))
        np.testing.assert_array_equal(a.y_train, y_train)
        np.testing.assert_array_equal(a.x_val, x_val.astype(np.float32))
        np.testing.assert_array_equal(a.y_val, y_val)
        assert a.x_train.dtype == np.float32 and a.y_train.dtype == a.y_val.dtype == np.int32
        assert a.num_classes == a.num_outputs == 7 and a.input_shape == (5, 3)


def test_the_config_states_the_task_and_the_classes(make_cfg, user_module):
    as_regression = loaded(make_cfg, "dataset.load=my_data:load", "dataset.task=regression")
    assert as_regression.num_classes is None and as_regression.y_train.dtype == np.float32
    from my_data import load

    np.testing.assert_array_equal(as_regression.y_train, load()[0][1].astype(np.float32))
    assert loaded(make_cfg, "dataset.load=my_data:load",
                  "dataset.num_classes=10").num_classes == 10
    whole_floats = external_data.checked("here", (np.zeros((3, 2)), np.array([0.0, 2.0, 1.0])),
                                         (np.zeros((1, 2)), np.array([1.0])), "classification")
    assert whole_floats[4] == 3 and whole_floats[1].tolist() == [0, 2, 1]
    column = external_data.checked("here", (np.zeros((3, 2)), np.array([[0], [2], [1]])),
                                   (np.zeros((1, 2)), np.array([[1]])))
    assert column[1].shape == (3,) and column[4] == 3  # a label column (N, 1) is flattened


# ---------------------------------------------------------------------------------- bad input
X, Y = np.zeros((4, 3)), np.array([0, 1, 0, 1])
BAD_DATA = {  # (training, validation): the one-line error
    "x and y of different lengths": (
        (X, Y[:3]), (X, Y), "here: x_train has 4 examples, y_train 3; they must have as many"),
    "examples of two shapes": (
        (X, Y), (np.zeros((4, 5)), Y),
        "here: training examples have shape (3,), validation examples (5,); they must have "
        "one shape"),
    "string labels": (
        (X, np.array(list("abab"))), (X, Y),
        "here: y_train has dtype <U1; labels must be integers (classes) or floats (regression "
        "targets)"),
    "boolean labels": (
        (X, Y.astype(bool)), (X, Y),
        "here: y_train has dtype bool; labels must be integers (classes) or floats (regression "
        "targets)"),
    "integers and floats": (
        (X, Y), (X, Y * 0.5),
        "here: y_train holds integers, y_val floats; both must be integers (class labels) or "
        "both floats (regression targets)"),
    "a negative class": (
        (X, Y - 1), (X, Y), "here: the labels hold -1; class labels must be integers >= 0"),
    "labels per feature": (
        (X, np.zeros((4, 3), int)), (X, Y),
        "here: y_train has shape (4, 3); it must hold one label or target per example, (4,)"),
    "no examples": (
        (X[:0], Y[:0]), (X, Y),
        "here: x_train has shape (0, 3); it must hold N >= 1 examples (N, F), (N, T, F) or "
        "(N, H, W, C)"),
    "text inputs": (
        (np.array([["a"]] * 4), Y), (X, Y), "here: x_train has dtype <U1; inputs must be numbers"),
}


@pytest.mark.parametrize("case", BAD_DATA)
def test_bad_arrays_are_one_line_naming_what_is_wrong(case):
    train_part, val_part, expected = BAD_DATA[case]
    with pytest.raises(ConfigError) as error:
        external_data.checked("here", train_part, val_part)
    assert str(error.value) == expected


def test_fewer_classes_than_the_labels_is_refused(make_cfg, user_module):
    with pytest.raises(ConfigError, match=r"^dataset.num_classes=5: must exceed the largest "
                                          r"label, 6$"):
        loaded(make_cfg, "dataset.load=my_data:load", "dataset.num_classes=5")


@pytest.mark.parametrize("loader, expected", [
    ("three_parts", "dataset.load=my_data:three_parts: must return ((x_train, y_train), "
                    "(x_val, y_val)) as NumPy arrays, or (train, val) as unbatched "
                    "tf.data.Datasets of (x, y) elements; it returned ((ndarray, ndarray), "
                    "(ndarray, ndarray), NoneType)"),
    ("batched", "dataset.load=my_data:batched: the training dataset's x has shape "
                "(None, 5, 3): every example must have one shape (a batched dataset? unbatch "
                "it)"),
])
def test_a_loader_returning_another_form_is_one_line(make_cfg, user_module, loader, expected):
    with pytest.raises(ConfigError) as error:
        loaded(make_cfg, f"dataset.load=my_data:{loader}")
    assert str(error.value) == expected


def test_keys_a_loader_does_not_take_and_a_missing_load_are_one_line(make_cfg, user_module):
    with pytest.raises(ConfigError, match=r"^dataset.kwargs=\{'m': 3\}: my_data:load got an "
                                          r"unexpected keyword argument 'm'$"):
        loaded(make_cfg, "dataset.load=my_data:load", "dataset.kwargs.m=3")
    with pytest.raises(ConfigError, match=r"^dataset.load=\?\?\?: must be set to a dotted path "
                                          r"such as my_package.module:function$"):
        config.validate(make_cfg("dataset=arrays"))  # before TensorFlow
    with pytest.raises(ConfigError, match=r"^dataset.num_classes=3: must be null when "
                                          r"dataset.task=regression$"):
        config.validate(make_cfg("dataset=arrays", "dataset.load=my_data:load",
                                 "dataset.task=regression", "dataset.num_classes=3"))


def assert_refused_before_training(result, run_dir, expected):
    """Exit status 2, one line on stderr, and a run directory that says failed."""
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"error: {expected}\n"
    summary = summary_of(run_dir)
    assert summary["status"] == "failed" and "data" not in summary
    assert not (run_dir / "metrics.csv").exists() and not (run_dir / "checkpoints").exists()


@pytest.mark.parametrize("overrides, expected", [
    (["dataset.load=my_datta:load"],
     "dataset.load=my_datta:load: cannot import my_datta (No module named 'my_datta')"),
    (["dataset.load=my_data:vectors", "model=cnn"],  # the model's check, once data are loaded
     "model=cnn: needs image inputs (H, W, C) or sequences (T, F), convolved along T; "
     "dataset=arrays gives vectors (5,)"),
])
def test_bad_input_on_the_command_line_exits_2_in_one_line(user_module, overrides, expected):
    result = gradexp("gradexp.train", "dataset=arrays", *overrides, *SHORT, "hydra.run.dir=run",
                     cwd=user_module)
    assert_refused_before_training(result, user_module / "run", expected)

