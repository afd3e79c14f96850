"""The datasets: generated ones against their definitions, keras.datasets through Keras's own
loading code on files written here in the format Keras expects, and the error for a missing file."""

from __future__ import annotations

import gzip
import io
import pickle
import shutil
import tarfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from gradexp.config import ConfigError
from gradexp.parts import data


def dataset(make_cfg, name, *overrides):
    return make_cfg(f"dataset={name}", *overrides).dataset


# ---------------------------------------------------------------------------- generated
@pytest.mark.parametrize("length", [11, 50])
def test_adding_problem_definition(make_cfg, length):
    x, y, num_classes = data.adding(dataset(make_cfg, "adding", "dataset.num_examples=4000",
                                            f"dataset.length={length}"))
    assert num_classes is None and x.shape == (4000, length, 2) and y.shape == (4000,)
    values, markers = x[..., 0], x[..., 1]
    assert values.min() >= 0 and values.max() < 1
    assert set(np.unique(markers)) == {0.0, 1.0}
    assert (markers.sum(axis=1) == 2).all()  # exactly two markers per sequence ...
    half = length // 2
    assert (markers[:, :half].sum(axis=1) == 1).all()  # ... one in each half
    assert (markers[:, half:].sum(axis=1) == 1).all()
    np.testing.assert_allclose(y, (values * markers).sum(axis=1), rtol=1e-6)  # y = v_i + v_j
    # the sum of two U[0, 1]: mean 1, variance 1/6 (the MSE of always predicting 1)
    assert abs(y.mean() - 1) < 0.03 and abs(y.var() - 1 / 6) < 0.02


def test_adding_is_a_regression_split_by_its_seed(make_cfg):
    d = dataset(make_cfg, "adding", "dataset.num_examples=100", "dataset.length=8")
    a, b = data.load(d), data.load(d)
    assert a.num_classes is None and a.num_outputs == 1 and a.input_shape == (8, 2)
    np.testing.assert_array_equal(a.x_val, b.x_val)
    assert len(a.x_train) == 80 and a.y_train.dtype == np.float32


def test_teacher_targets_are_standardised_and_seeded(make_cfg):
    d = dataset(make_cfg, "teacher", "dataset.num_examples=2000", "dataset.noise=0")
    x, y, num_classes = data.teacher(d)
    assert num_classes is None and x.shape == (2000, 32) and y.shape == (2000,)
    assert abs(y.mean()) < 1e-5 and abs(y.std() - 1) < 1e-5
    np.testing.assert_array_equal(y, data.teacher(d)[1])
    other = dataset(make_cfg, "teacher", "dataset.num_examples=2000", "dataset.seed=1")
    assert not np.allclose(y, data.teacher(other)[1])


# ---------------------------------------------------------------------------------- mnist1d
@pytest.mark.slow
def test_mnist1d_is_the_packages_make_dataset_with_its_own_split(make_cfg):
    from mnist1d.data import get_dataset_args, make_dataset
    from omegaconf import OmegaConf

    d = dataset(make_cfg, "mnist1d")
    assert d.seed == 42 and d.val_fraction is None  # the published set, the package's split
    np.random.seed(5)
    numpy_state = np.random.get_state()
    a = data.load(d)
    after = np.random.get_state()  # make_dataset reseeds the global generator: put back
    np.testing.assert_array_equal(after[1], numpy_state[1])
    assert after[2] == numpy_state[2]
    assert (a.x_train.shape, a.x_val.shape) == ((4000, 40, 1), (1000, 40, 1))
    assert (a.y_train.shape, a.y_val.shape) == ((4000,), (1000,))
    assert a.x_train.dtype == a.x_val.dtype == np.float32
    assert a.y_train.dtype == a.y_val.dtype == np.int32
    assert a.num_classes == a.num_outputs == 10 and a.stream is None and a.x_test is None
    assert a.input_shape == OmegaConf.to_object(d).input_shape() == (40, 1)
    assert set(np.unique(a.y_train)) == set(np.unique(a.y_val)) == set(range(10))
    direct = make_dataset(get_dataset_args())  # generated again, here: the same numbers
    for ours, theirs in ((a.x_train[..., 0], direct["x"]), (a.x_val[..., 0], direct["x_test"]),
                         (a.y_train, direct["y"]), (a.y_val, direct["y_test"])):
        np.testing.assert_array_equal(ours, theirs.astype(ours.dtype))
    data.mnist1d_generated.cache_clear()
    b = data.load(d)  # generated anew: two loads are equal
    for name in ("x_train", "y_train", "x_val", "y_val"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


# ------------------------------------------------------------------------- keras.datasets
# The files as Keras downloads them (keras/src/datasets/*.py), with a few examples each.
LABELS = np.arange(10, dtype=np.uint8)


def grey_images(n, seed):
    return np.random.default_rng(seed).integers(0, 256, (n, 28, 28), dtype=np.uint8)


def write_mnist(cache_dir):
    np.savez(cache_dir / "mnist.npz", x_train=grey_images(10, 0), y_train=LABELS,
             x_test=grey_images(4, 1), y_test=LABELS[:4])
    return grey_images(10, 0)


def write_fashion_mnist(cache_dir):
    """IDX files, gzipped: labels after an 8-byte header, images after a 16-byte one."""
    folder = cache_dir / "fashion-mnist"
    folder.mkdir()
    for split, n, seed in (("train", 10, 0), ("t10k", 4, 1)):
        labels = np.array([2049, n], ">i4").tobytes() + LABELS[:n].tobytes()
        images = np.array([2051, n, 28, 28], ">i4").tobytes() + grey_images(n, seed).tobytes()
        (folder / f"{split}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels))
        (folder / f"{split}-images-idx3-ubyte.gz").write_bytes(gzip.compress(images))
    return grey_images(10, 0)


def write_cifar10(cache_dir):
    """The python-version tarball: cifar-10-batches-py/{data_batch_1..5, test_batch}, each a
    pickled dict whose b"data" is 10 000 × 3072 bytes (channel-major 32×32×3) and b"labels" a
    list. Keras keeps the archive as <fname>_archive and fills 10 000 rows per batch. The rows
    repeat ten images, so the archive is small."""
    images = np.random.default_rng(0).integers(0, 256, (10, 3072), dtype=np.uint8)
    rows = np.arange(10_000) % 10
    batch = pickle.dumps({b"batch_label": b"fake", b"labels": rows.tolist(),
                          b"data": images[rows]},
                         protocol=4)  # 5 rebuilds arrays with a function Keras's unpickler refuses
    archive = cache_dir / "cifar-10-batches-py-target_archive"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(batch)
            tar.addfile(info, io.BytesIO(batch))
    return images.reshape(10, 3, 32, 32).transpose(0, 2, 3, 1)


KERAS_SETS = {  # name: (writer, one example's shape, examples)
    "mnist": (write_mnist, (28, 28, 1), 14),
    "fashion_mnist": (write_fashion_mnist, (28, 28, 1), 14),
    "cifar10": (write_cifar10, (32, 32, 3), 60_000),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", KERAS_SETS)
def test_keras_dataset_loads_files_from_cache_dir(make_cfg, tmp_path, name):
    write, shape, total = KERAS_SETS[name]
    first_images = write(tmp_path)
    d = dataset(make_cfg, name, f"dataset.cache_dir={tmp_path}", "dataset.num_examples=null")
    x, y, num_classes = data.keras_images(d)  # keras.datasets.<name>.load_data(), for real
    assert x.shape == (total, *shape) and x.dtype == np.float32 and num_classes == 10
    expected = first_images.reshape(len(first_images), *shape)
    np.testing.assert_allclose(x[:10], expected / 255.0, rtol=1e-6)  # the training files first
    np.testing.assert_array_equal(y[:10], LABELS)
    subset = data.load(dataset(make_cfg, name, f"dataset.cache_dir={tmp_path}",
                               "dataset.num_examples=10", "dataset.val_fraction=0.2"))
    assert (len(subset.x_train), len(subset.x_val)) == (8, 2)
    assert subset.input_shape == shape and subset.num_outputs == 10
    shutil.rmtree(tmp_path)  # cifar10 extracts 180 MB


MISSING = {  # name: the file Keras looks for first, relative to cache_dir, and where it is from
    "mnist": ("mnist.npz", "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"),
    "fashion_mnist": ("fashion-mnist/train-labels-idx1-ubyte.gz",
                      "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"
                      "train-labels-idx1-ubyte.gz"),
    "cifar10": ("cifar-10-batches-py-target_archive",
                "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
}


@pytest.fixture
def no_network(monkeypatch):
    """Downloads go to a proxy on a closed local port: they fail at once, with or without a
    network, and nothing is downloaded."""
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    urllib.request.install_opener(urllib.request.build_opener())  # reads the proxies now
    yield
    urllib.request.install_opener(None)


@pytest.mark.parametrize("name", MISSING)
def test_missing_keras_file_is_one_line_naming_file_and_place(make_cfg, tmp_path, name,
                                                               no_network):
    relative, origin = MISSING[name]
    cache = tmp_path / "not" / "made"  # bad input changes nothing on disk: no directory made
    d = dataset(make_cfg, name, f"dataset.cache_dir={cache}")
    started = time.perf_counter()
    with pytest.raises(ConfigError) as error:
        data.load(d)
    assert time.perf_counter() - started < 5
    message = str(error.value)
    target = cache / relative
    assert "\n" not in message
    assert message.startswith(f"dataset={name}: no {target.name} in {target.parent}, and "
                              f"downloading it from {origin} failed (")
    assert message.endswith(f"); save that file as {target}, or set dataset.cache_dir to a "
                            "directory that has it")
    assert list(tmp_path.iterdir()) == []


def test_default_cache_dir_is_keras_own(make_cfg):
    from keras.src.backend.config import keras_home

    d = dataset(make_cfg, "mnist")
    assert d.cache_dir is None
    assert data.cache_dir(d) == Path(keras_home()).expanduser() / "datasets"


def test_digits_are_sklearns_images_on_the_unit_interval(make_cfg):
    """x / 16: the 8x8 images' 0..16 pixel counts as (8, 8, 1) float32 images in [0, 1]."""
    from sklearn.datasets import load_digits

    x, y, num_classes = data.LOADERS["digits"](dataset(make_cfg, "digits"))
    bunch = load_digits()
    assert x.shape == (1797, 8, 8, 1) and x.dtype == np.float32 and num_classes == 10
    np.testing.assert_array_equal(x[..., 0] * 16, bunch.images)  # k / 16 is exact in float32
    assert x.max() == 1.0 and x.min() == 0.0
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, bunch.target)


@pytest.mark.slow
def test_mnist1d_with_a_validation_fraction_keeps_the_packages_test_set_sealed(make_cfg):
    """val_fraction 0.25: 1000 of the 4000 training sequences (the first of a permutation by the
    dataset's seed) validate, 3000 train, and the package's 1000 test sequences are the test
    split."""
    d = dataset(make_cfg, "mnist1d", "dataset.val_fraction=0.25")
    a = data.load(d)
    made = data.mnist1d_generated(42)
    assert (len(a.x_train), len(a.x_val), len(a.x_test)) == (3000, 1000, 1000)
    assert a.num_classes == 10 and a.x_test.shape[1:] == (40, 1)
    order = np.random.default_rng(42).permutation(4000)
    np.testing.assert_array_equal(a.x_val[..., 0], made["x"][order[:1000]].astype(np.float32))
    np.testing.assert_array_equal(a.y_train, made["y"][order[1000:]])
    np.testing.assert_array_equal(a.x_test[..., 0], made["x_test"].astype(np.float32))
    np.testing.assert_array_equal(a.y_test, made["y_test"])
    x_test, y_test = data.sealed_test_set(a)
    np.testing.assert_array_equal(x_test.numpy(), a.x_test)
    np.testing.assert_array_equal(y_test.numpy(), a.y_test)


def test_only_uint8_pixels_are_scaled():
    pixels = np.array([0, 51, 255], np.uint8)
    scaled = data.unit_scaled(pixels)
    assert scaled.dtype == np.float32
    np.testing.assert_array_equal(scaled, np.float32([0, 51, 255]) / np.float32(255))
    other = np.array([0.0, 51.0, 255.0], np.float32)
    assert data.unit_scaled(other) is other  # as it is: not divided


def test_a_split_holds_out_at_least_one_example_drawn_by_the_seed():
    """max(1, round(N · val_fraction)) examples validate, the first of a permutation by the
    seed: 10 examples at 0.01 hold out 1 (round gives 0), at 0.25 hold out 2 (round(2.5))."""
    x, y = np.arange(10, dtype=np.float32)[:, None], np.arange(10, dtype=np.int32) + 100
    for fraction, n_val in [(0.01, 1), (0.25, 2), (0.5, 5)]:
        a = data.split_off(x, y, fraction, seed=4, num_classes=None)
        order = np.random.default_rng(4).permutation(10)
        np.testing.assert_array_equal(a.x_val[:, 0], order[:n_val])
        np.testing.assert_array_equal(a.y_val, order[:n_val] + 100)
        np.testing.assert_array_equal(a.y_train, order[n_val:] + 100)
        assert a.num_classes is None and len(a.x_train) == 10 - n_val


def test_a_runs_record_of_its_data(make_cfg):
    """summary.json's `data`: the training examples counted, or None when they are drawn fresh
    at every step; the test split's examples when there is one."""
    fixed = data.load(dataset(make_cfg, "adding", "dataset.num_examples=50",
                              "dataset.length=10"))
    assert fixed.record() == {"input_shape": [10, 2], "num_classes": None,
                              "train_examples": 40, "val_examples": 10}  # val_fraction 0.2
    streamed = data.load(dataset(make_cfg, "adding", "dataset.num_examples=50",
                                 "dataset.length=10", "dataset.stream=true"))
    assert streamed.record()["train_examples"] is None
    assert streamed.record()["val_examples"] == 50
    fixed.x_test, fixed.y_test = fixed.x_val[:3], fixed.y_val[:3]
    assert fixed.record()["test_examples"] == 3


def test_batches_are_epochs_of_permutations_and_any_stretch_of_them_is_the_same():
    """n = 5, B = 2: the batches of steps 1.. laid end to end are epoch after epoch, each a
    permutation of the 5 examples; the batches asked from any step (in any epoch, ending on an
    epoch's first example or not) are those of the whole sequence."""
    from gradexp._tf import tf

    whole = data.batch_indices(tf.constant(3, tf.int64), 5, 2, 0, 15).numpy().reshape(-1)
    for epoch in range(6):
        assert sorted(whole[5 * epoch:5 * epoch + 5]) == [0, 1, 2, 3, 4]
    assert not all((whole[:5] == whole[5 * e:5 * e + 5]).all() for e in range(1, 6))
    for first_step, steps in [(0, 3), (2, 2), (7, 4), (11, 4), (4, 1)]:
        part = data.batch_indices(tf.constant(3, tf.int64), 5, 2, first_step, steps).numpy()
        np.testing.assert_array_equal(part.reshape(-1),
                                      whole[2 * first_step:2 * (first_step + steps)])


def test_the_training_batches_go_on_past_their_first_block(make_cfg):
    """training_batches (model.fit's input) draws 64 steps' batches at a time: its batches 1 to
    130 are the trainer's own (`examples`) for steps 1 to 130, across two blocks' seams."""
    from gradexp._tf import tf

    a = data.load(dataset(make_cfg, "adding", "dataset.num_examples=60", "dataset.length=4"))
    x, _, indices = data.examples(a, tf.constant([3], tf.int64), 4, 0, 130)
    batches = [bx.numpy() for bx, _ in data.training_batches(a, batch_size=4, seed=3).take(131)]
    assert len(batches) == 130 + 1
    for i in (0, 63, 64, 65, 127, 128, 129):
        np.testing.assert_array_equal(batches[i], tf.gather(x, indices[0, i]).numpy())
    later = next(iter(data.training_batches(a, batch_size=4, seed=3, start_step=100)))[0]
    np.testing.assert_array_equal(later.numpy(), batches[100])


def test_a_streams_batches_have_their_static_shape_in_a_traced_step(make_cfg):
    """The stream's examples come through tf.numpy_function, whose outputs have no shape: the
    graph is told it ([None, *example shape]), as a model's first layer needs."""
    from gradexp._tf import tf

    a = data.load(dataset(make_cfg, "adding", "dataset.num_examples=50", "dataset.length=10",
                          "dataset.stream=true"))
    traced = tf.function(lambda first: data.examples(a, tf.constant([3], tf.int64), 4, first, 2))
    x, y, _ = traced.get_concrete_function(tf.TensorSpec([], tf.int64)).structured_outputs
    assert x.shape.as_list() == [None, 10, 2] and y.shape.as_list() == [None]


def test_a_batch_larger_than_the_training_set_is_refused_in_one_line():
    from gradexp._tf import tf

    three = data.Arrays(np.zeros((3, 2), np.float32), np.zeros(3, np.int32),
                        np.zeros((1, 2), np.float32), np.zeros(1, np.int32), 2)
    with pytest.raises(ConfigError) as error:
        data.examples(three, tf.constant([0], tf.int64), 4, 0, 2)
    assert str(error.value) == "trainer.batch_size=4: larger than the 3 training examples"
    _, _, indices = data.examples(three, tf.constant([0], tf.int64), 3, 0, 2)
    assert sorted(indices.numpy()[0, 0]) == [0, 1, 2]  # three fit: each once in an epoch


def test_a_streams_examples_for_several_runs_are_each_runs_own_draws(make_cfg):
    """`examples` for runs of seeds [3, 4] over steps 6 and 7: run k's batch of step 6 + i is
    x[indices[k, i]], the stream's draw for (seed, step 5 + i)."""
    from gradexp._tf import tf

    a = data.load(dataset(make_cfg, "adding", "dataset.num_examples=50", "dataset.length=10",
                          "dataset.stream=true"))
    x, y, indices = data.examples(a, tf.constant([3, 4], tf.int64), 4, tf.constant(5, tf.int64), 2)
    assert indices.shape == (2, 2, 4) and x.dtype == a.x_val.dtype
    for k, seed in enumerate((3, 4)):
        for i in range(2):
            drawn_x, drawn_y = a.stream(seed, 5 + i, 4)
            np.testing.assert_array_equal(tf.gather(x, indices[k, i]).numpy(), drawn_x)
            np.testing.assert_array_equal(tf.gather(y, indices[k, i]).numpy(), drawn_y)


# ---------------------------------------------------------------------------- streaming
def test_pascanu_adding_problem_definition(make_cfg):
    """Pascanu et al. (2013), as their code makes it: v ~ U[0, 1), the first marker in the first
    10% of the steps, the second in 10-50%, y = the mean of the two marked values."""
    x, y, _ = data.adding(dataset(make_cfg, "adding", "dataset.num_examples=4000",
                                  "dataset.variant=pascanu2013", "dataset.length=50"))
    values, markers = x[..., 0], x[..., 1]
    assert values.min() >= 0 and values.max() < 1
    assert (markers[:, :5].sum(axis=1) == 1).all()  # T/10 = 5
    assert (markers[:, 5:25].sum(axis=1) == 1).all()  # 10-50%: steps 5..24
    assert (markers[:, 25:].sum(axis=1) == 0).all()
    np.testing.assert_allclose(y, (values * markers).sum(axis=1) / 2, rtol=1e-6, atol=1e-7)
    # the mean of two U[0, 1]: mean 0.5, variance 1/24; |y - 0.5| > 0.2 for 2 · 2 · 0.3² = 36%
    assert abs(y.mean() - 0.5) < 0.01 and abs(y.var() - 1 / 24) < 0.003
    assert abs(np.mean((y - 0.5) ** 2 > 0.04) - 0.36) < 0.02


@pytest.mark.parametrize("name", ["adding", "teacher", "synthetic"])
def test_streamed_examples_depend_only_on_the_seeds_and_the_step(make_cfg, name):
    d = dataset(make_cfg, name, "dataset.num_examples=300", "dataset.stream=true")
    a, b = data.load(d), data.load(d)
    assert len(a.x_train) == 0 and len(a.x_val) == 300  # the whole fixed set is held out
    fixed_x, fixed_y, _ = data.LOADERS[name](d)
    np.testing.assert_array_equal(a.x_val, fixed_x)  # ... the same as without streaming
    np.testing.assert_array_equal(a.y_val, fixed_y)
    x1, y1 = a.stream(7, 12, 20)
    x2, y2 = b.stream(7, 12, 20)  # another load, another process would agree
    np.testing.assert_array_equal(x1, x2) and np.testing.assert_array_equal(y1, y2)
    for other in (a.stream(7, 13, 20), a.stream(8, 12, 20)):  # another step, another run seed
        assert not np.array_equal(x1, other[0])
    other_data = data.load(dataset(make_cfg, name, "dataset.num_examples=300",
                                   "dataset.stream=true", "dataset.seed=1"))
    assert not np.array_equal(x1, other_data.stream(7, 12, 20)[0])  # another dataset seed
    assert x1.shape == (20, *a.input_shape) and x1.dtype == np.float32


def test_a_stream_resumed_at_a_step_draws_what_an_uninterrupted_one_would(make_cfg):
    d = dataset(make_cfg, "adding", "dataset.num_examples=50", "dataset.length=10",
                "dataset.stream=true")
    a = data.load(d)
    whole = data.training_batches(a, batch_size=4, seed=3)
    later = data.training_batches(a, batch_size=4, seed=3, start_step=5)
    batches = [x.numpy() for x, _ in whole.take(8)]
    for k, (x, _) in enumerate(later.take(3)):
        np.testing.assert_array_equal(x.numpy(), batches[5 + k])
        np.testing.assert_array_equal(x.numpy(), a.stream(3, 5 + k, 4)[0])
    assert not np.array_equal(batches[0], batches[1])  # fresh examples at every step
