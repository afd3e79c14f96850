"""Any data: a user's loader (dataset=arrays) and a prepared TensorFlow Datasets dataset
(dataset=tfds), trained on through the command line as a user would, and each bad input
answered in one line before anything trains."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from conftest import gradexp
from gradexp import config
from gradexp.config import ConfigError
from gradexp.parts import data, external_data
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
@pytest.mark.slow
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


@pytest.mark.slow
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
                    "tf.data.Datasets of (x, y) elements, and a third part of its kind for a "
                    "test split; it returned ((ndarray, ndarray), (ndarray, ndarray), "
                    "NoneType)"),
    ("batched", "dataset.load=my_data:batched: the training examples' x has shape "
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
@pytest.mark.slow
def test_bad_input_on_the_command_line_exits_2_in_one_line(user_module, overrides, expected):
    result = gradexp("gradexp.train", "dataset=arrays", *overrides, *SHORT, "hydra.run.dir=run",
                     cwd=user_module)
    assert_refused_before_training(result, user_module / "run", expected)


# -------------------------------------------------------------------------------- dataset=tfds
def tiny_shapes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n grey 6×5 uint8 images and their labels in {0, 1, 2}."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 6, 5, 1), dtype=np.uint8), rng.integers(0, 3, n)


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    """A data_dir holding `tiny_shapes` (160 training images, 40 test ones), prepared offline by
    tensorflow-datasets' own machinery: a GeneratorBasedBuilder's download_and_prepare. Its class
    is not registered with TFDS (as a user's builder is not, in gradexp's process): the runs find
    the dataset by its files alone, and a second setup in one process (mutmut's) is no clash."""
    import tensorflow_datasets as tfds

    class TinyShapes(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(6, 5, 1)),
                "label": tfds.features.ClassLabel(num_classes=3)}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(160, 0),
                    "test": self._generate_examples(40, 1)}

        def _generate_examples(self, n, seed):
            images, labels = tiny_shapes(n, seed)
            for i in range(n):
                yield i, {"image": images[i], "label": labels[i]}

    data_dir = tmp_path_factory.mktemp("tfds")
    TinyShapes(data_dir=str(data_dir)).download_and_prepare()
    return data_dir


def tfds_overrides(data_dir, name="tiny_shapes"):
    return ["dataset=tfds", f"dataset.name={name}", f"dataset.data_dir={data_dir}"]


@pytest.mark.slow
def test_a_prepared_tfds_dataset_trains_from_its_files_alone(tfds_dir, tmp_path):
    """The training process never imports the builder: it reads the prepared files."""
    result = gradexp("gradexp.train", *tfds_overrides(tfds_dir), *SHORT, *SMALL_MLP,
                     "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = summary_of(tmp_path / "run")
    assert summary["status"] == "completed"
    assert summary["data"] == {"input_shape": [6, 5, 1], "num_classes": 3,
                               "train_examples": 160, "val_examples": 40}
    assert "training mlp on tiny_shapes" in (tmp_path / "run" / "train.log").read_text()


@pytest.mark.slow
def test_tfds_images_are_scaled_to_the_unit_interval(make_cfg, tfds_dir):
    a = data.load(make_cfg(*tfds_overrides(tfds_dir)).dataset)
    for x, y, (images, labels) in ((a.x_train, a.y_train, tiny_shapes(160, 0)),
                                   (a.x_val, a.y_val, tiny_shapes(40, 1))):
        assert x.dtype == np.float32 and y.dtype == np.int32
        # TFDS shuffles the examples as it writes them: compare both in the images' sort order
        ours, theirs = (np.lexsort(v.reshape(len(v), -1).T) for v in (x, images))
        np.testing.assert_allclose(x[ours], images[theirs] / 255.0, rtol=1e-6)
        np.testing.assert_array_equal(y[ours], labels[theirs])
    half = data.load(make_cfg(*tfds_overrides(tfds_dir), 'dataset.split_train="train[:50%]"',
                              'dataset.split_val="train[50%:]"').dataset)
    assert (len(half.x_train), len(half.x_val)) == (80, 80) and half.x_test is None
    tested = data.load(make_cfg(*tfds_overrides(tfds_dir), 'dataset.split_train="train[:50%]"',
                                'dataset.split_val="train[50%:]"', "dataset.split_test=test")
                       .dataset)  # the test split: the 40 test images, scaled and checked
    ours, theirs = (np.lexsort(v.reshape(len(v), -1).T) for v in (tested.x_test, a.x_val))
    np.testing.assert_array_equal(tested.x_test[ours], a.x_val[theirs])
    np.testing.assert_array_equal(tested.y_test[ours], a.y_val[theirs])
    assert tested.y_test.dtype == np.int32 and tested.record()["test_examples"] == 40


@pytest.mark.slow
def test_a_tfds_name_not_prepared_exits_2_naming_what_data_dir_holds(tfds_dir, tmp_path):
    before = sorted(tfds_dir.rglob("*"))
    result = gradexp("gradexp.train", *tfds_overrides(tfds_dir, "mnist"), *SHORT,
                     "hydra.run.dir=run", cwd=tmp_path)
    assert_refused_before_training(
        result, tmp_path / "run",
        f"dataset.name=mnist: not prepared in dataset.data_dir={tfds_dir}, which holds "
        "tiny_shapes")
    assert sorted(tfds_dir.rglob("*")) == before  # nothing downloaded, nothing made


@pytest.mark.parametrize("overrides, expected", [
    (["dataset.x_key=pixels"], "dataset.x_key=pixels: must be one of tiny_shapes's features: "
                               "image, label"),
    (["dataset.split_val=validation"], "dataset.split_val=validation: Unknown split "
                                       "'validation'. Should be one of ['train', 'test']."),
])
def test_a_tfds_key_or_split_it_lacks_is_one_line(make_cfg, tfds_dir, overrides, expected):
    with pytest.raises(ConfigError) as error:
        data.load(make_cfg(*tfds_overrides(tfds_dir), *overrides).dataset)
    assert str(error.value) == expected


def test_tfds_without_a_name_or_a_directory_is_one_line(make_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"^dataset.name=tfds: must be the TFDS name of a "
                                          r"dataset prepared in data_dir, e.g. "
                                          r"dataset.name=mnist$"):
        config.validate(make_cfg("dataset=tfds"))  # before TensorFlow
    missing = tmp_path / "nothing"
    with pytest.raises(ConfigError) as error:
        data.load(make_cfg(*tfds_overrides(missing)).dataset)
    assert str(error.value) == (f"dataset.name=tiny_shapes: not prepared in "
                                f"dataset.data_dir={missing}, which holds nothing (no such "
                                "directory)")
    assert not missing.exists()
