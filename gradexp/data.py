"""Datasets (arrays in memory) and their tf.data pipelines.

Each loader, registered by `@loader(name)` under its schema's name (gradexp/config/dataset.py),
returns (x, y, num_classes); num_classes None means regression (y is a float per
example, the model has one output). `synthetic`, `adding` and `teacher` are generated from
`dataset.seed`, `digits` ships inside the scikit-learn wheel, and `mnist`, `fashion_mnist`,
`cifar10` are keras.datasets files, read from `dataset.cache_dir` (downloaded there when
missing, if the network allows). The split into training and validation depends on
`dataset.seed` only, so runs that differ in `seed` see the same data in a different order.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from gradexp._tf import keras, tf
from gradexp.config import ConfigError, Registry

DOWNLOAD_TIMEOUT_S = 30  # per connection attempt or read: a silent network fails in seconds
LOADERS = Registry("dataset", "loader", "gradexp/data.py")
loader = LOADERS.add  # @loader("digits"): the loader of dataset=digits


@dataclass
class Arrays:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int | None  # None: regression

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def num_outputs(self) -> int:
        """Logits per class, or one predicted value for regression."""
        return 1 if self.num_classes is None else self.num_classes


@loader("synthetic")
def synthetic(d: DictConfig) -> tuple[np.ndarray, np.ndarray, int]:
    """Gaussian clusters: mean_c ~ N(0, separation²·I), x = mean_y + N(0, I), y uniform."""
    rng = np.random.default_rng(d.seed)
    means = rng.normal(0.0, d.separation, (d.num_classes, d.num_features))
    y = rng.integers(0, d.num_classes, d.num_examples)
    x = means[y] + rng.normal(0.0, 1.0, (d.num_examples, d.num_features))
    return x.astype(np.float32), y.astype(np.int32), d.num_classes


@loader("digits")
def digits(d: DictConfig) -> tuple[np.ndarray, np.ndarray, int]:
    """scikit-learn's 8x8 digits as (8, 8, 1) images in [0, 1]."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[..., None]
    return x, bunch.target.astype(np.int32), 10


@loader("adding")
def adding(d: DictConfig) -> tuple[np.ndarray, np.ndarray, None]:
    """The adding problem, a regression over a long sequence (T = `length` steps):

        x[t] = (v_t, m_t),  v_t ~ U[0, 1],  m_t = 1 at t = i and t = j, else 0,
        i ~ U{0, ..., T//2 - 1},  j ~ U{T//2, ..., T - 1}    (one marker in each half)
        y = v_i + v_j

    The form of Le, Jaitly & Hinton (2015) and Arjovsky et al. (2016). Predicting the mean, 1,
    scores MSE = Var(v_i + v_j) = 2/12 ≈ 0.167: the level a model must get below. The
    original (Hochreiter & Schmidhuber 1997, experiment 4) differs: v ~ U[-1, 1], lengths vary
    in [T, T + T/10], the first marker is among the first ten steps and the second among the
    first T/2 - 1, m = -1 at the first and last step, and the target is 0.5 + (X1 + X2)/4.
    """
    rng = np.random.default_rng(d.seed)
    n, length, half = d.num_examples, d.length, d.length // 2
    values = rng.uniform(0.0, 1.0, (n, length))
    rows = np.arange(n)
    first, second = rng.integers(0, half, n), rng.integers(half, length, n)
    markers = np.zeros((n, length))
    markers[rows, first] = markers[rows, second] = 1.0
    x = np.stack([values, markers], axis=-1)
    y = values[rows, first] + values[rows, second]
    return x.astype(np.float32), y.astype(np.float32), None


@loader("teacher")
def teacher(d: DictConfig) -> tuple[np.ndarray, np.ndarray, None]:
    """Teacher-student regression, a task for deep MLPs (F = `num_features`, L = `depth`):

        x ~ N(0, I_F),  h_0 = x,  h_l = tanh(W_l h_{l-1}),  W_l ~ N(0, gain² / fan_in)  (l ≤ L)
        f(x) = w · h_L,  w ~ N(0, 1 / width)
        y = (f(x) - mean f) / std f + noise · N(0, 1)

    With gain > 1 the teacher is in tanh's chaotic regime (Poole et al. 2016): f is a rough
    function that a deep student needs many layers to fit. The targets have unit variance, so
    the score to beat is MSE ≈ 1 + noise². Gradients explode in the student, not here: the
    squared error's dy = 2(ŷ - y) is unbounded (unlike cross-entropy's), and a deep student with
    large initial weights amplifies it layer by layer. Measured (seeds 0 and 1, 300 steps):
    model.depth=16 model.width=64 model.activation=tanh model.initializer=he_normal diverges
    by step 20 unclipped and reaches validation MSE ≈ 0.5 with clip=0.1.
    """
    rng = np.random.default_rng(d.seed)
    x = rng.normal(0.0, 1.0, (d.num_examples, d.num_features))
    h = x
    for _ in range(d.depth):
        w = rng.normal(0.0, d.gain / np.sqrt(h.shape[1]), (h.shape[1], d.width))
        h = np.tanh(h @ w)
    f = h @ rng.normal(0.0, 1.0 / np.sqrt(d.width), d.width)
    y = (f - f.mean()) / f.std() + d.noise * rng.normal(0.0, 1.0, d.num_examples)
    return x.astype(np.float32), y.astype(np.float32), None


# ---------------------------------------------------------------------------- keras.datasets
@loader("mnist")
@loader("fashion_mnist")
@loader("cifar10")
def keras_images(d: DictConfig) -> tuple[np.ndarray, np.ndarray, int]:
    """keras.datasets.<name>.load_data(), its files in `d.cache_dir`: training and test images
    pooled as (N, H, W, C) in [0, 1] (then a random subset of `d.num_examples`, if set)."""
    load_data = getattr(keras.datasets, d.name).load_data
    with keras_files_in(cache_dir(d), d.name, load_data):
        (x_train, y_train), (x_test, y_test) = load_data()
    x, y = np.concatenate([x_train, x_test]), np.concatenate([y_train, y_test]).reshape(-1)
    if d.num_examples is not None:
        keep = np.random.default_rng(d.seed).permutation(len(x))[:d.num_examples]
        x, y = x[keep], y[keep]
    if x.ndim == 3:
        x = x[..., None]  # grey images get their channel axis
    x = x.astype(np.float32)
    x /= 255.0  # in place: cifar10 is 0.7 GB as float32
    return x, y.astype(np.int32), 10


def cache_dir(d: DictConfig) -> Path:
    """Where the files are: `d.cache_dir`, else Keras's own (what keras_home() says + /datasets)."""
    if d.cache_dir is not None:
        return Path(d.cache_dir).expanduser().resolve()
    from keras.src.backend.config import keras_home  # read from KERAS_HOME when Keras loads

    return Path(keras_home()).expanduser() / "datasets"


@contextlib.contextmanager
def keras_files_in(directory: Path, dataset: str, load_data):
    """Run a keras.datasets loader with its files looked up in (or downloaded to) `directory`.

    Keras's loaders take no directory: each calls `get_file`, which reads Keras's home from
    KERAS_HOME once, when Keras is imported. So for the length of the call, the loader's module
    gets a `get_file` that puts `directory` where Keras would put `~/.keras/datasets`; the
    loader's own code still finds, downloads, extracts and parses the files.
    """
    module = sys.modules[load_data.__module__]
    keras_get_file = module.get_file

    def get_file(fname=None, origin=None, file_hash=None, cache_subdir="datasets",
                 extract=False, **kwargs):
        where = directory / os.path.relpath(cache_subdir, "datasets")  # fashion-mnist/ stays
        target = where / keras_download_name(fname, extract)
        if target.exists():
            # Someone put this file here: use it. On a hash mismatch Keras would delete it and
            # download again, and here that fails.
            file_hash = None
        try:
            return keras_get_file(fname, origin=origin, file_hash=file_hash,
                                  cache_subdir=str(where), extract=extract, **kwargs)
        except Exception as exc:
            if target.exists():
                raise
            # Keras says "URL fetch failure on <origin>: <errno> -- <reason>": keep the reason
            reason = (str(exc).splitlines() or [type(exc).__name__])[0].rpartition(" -- ")[2]
            raise ConfigError(
                f"dataset={dataset}: no {target.name} in {where}, and downloading it from "
                f"{origin} failed ({reason}); save that file as {target}, or set "
                "dataset.cache_dir to a directory that has it") from None

    timeout = socket.getdefaulttimeout()
    module.get_file = get_file
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)  # urlretrieve has no timeout of its own
    try:
        yield
    finally:
        module.get_file = keras_get_file
        socket.setdefaulttimeout(timeout)


def keras_download_name(fname: str, extract: bool) -> str:
    """The file name Keras's get_file keeps a download under (keras/src/utils/file_utils.py):
    `fname` itself, but an archive to extract without a dot in `fname` is `<fname>_archive`
    (cifar10: cifar-10-batches-py-target_archive, the .tar.gz renamed)."""
    return f"{fname}_archive" if extract and "." not in fname else fname


def load(d: DictConfig) -> Arrays:
    """The dataset of `cfg.dataset`, split into training and validation by `d.seed`."""
    x, y, num_classes = LOADERS[d.name](d)
    order = np.random.default_rng(d.seed).permutation(len(x))
    n_val = max(1, int(round(len(x) * d.val_fraction)))
    val, train = order[:n_val], order[n_val:]
    return Arrays(x[train], y[train], x[val], y[val], num_classes)


def pipelines(a: Arrays, batch_size: int, seed: int,
              start_step: int = 0) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """Endless training batches and one pass of validation batches.

    Training order: epoch e is the permutation argsort(stateless_uniform(n, seed=[seed, e])) of
    the n training examples; batches of `batch_size` run across epoch boundaries. The order is
    a function of (seed, position) alone, so a resumed run starts at the batch of `start_step`
    directly — no iterator state to save, and the same batches as an uninterrupted run.
    """
    n = len(a.x_train)
    if batch_size > n:
        raise ConfigError(f"trainer.batch_size={batch_size}: larger than the "
                         f"{n} training examples")
    x_train, y_train = tf.constant(a.x_train), tf.constant(a.y_train)
    first_example = start_step * batch_size

    def epoch_order(epoch):
        noise = tf.random.stateless_uniform([n], seed=tf.stack([tf.cast(seed, tf.int64), epoch]))
        return tf.data.Dataset.from_tensor_slices(tf.argsort(noise))

    train = (tf.data.Dataset.range(first_example // n, 2**62)
             .flat_map(epoch_order)
             .skip(first_example % n)
             .batch(batch_size, drop_remainder=True)
             .map(lambda i: (tf.gather(x_train, i), tf.gather(y_train, i)))
             .prefetch(tf.data.AUTOTUNE))
    val = (tf.data.Dataset.from_tensor_slices((a.x_val, a.y_val))
           .batch(batch_size)
           .cache()
           .prefetch(tf.data.AUTOTUNE))
    return train, val
