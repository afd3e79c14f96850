"""Datasets (arrays in memory) and the training batches drawn from them.

Each loader, registered by `@loader(name)` under its schema's name (gradexp/config/dataset.py),
returns (x, y, num_classes), which `load` splits by `dataset.seed` alone (runs that differ in
`seed` see the same data in another order); num_classes None means regression (y a float per
example, the model has one output). A dataset with its own split (`mnist1d`, and `arrays` and
`tfds`, read and checked by gradexp/parts/external_data.py) returns `Arrays`, kept as they are;
those may hold a test split, which only `sealed_test_set` gives out, for the one evaluation after
training (trainer.test).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from gradexp._tf import keras, tf
from gradexp.config import ConfigError, DatasetConfig, Registry
from gradexp.parts import external_data

DOWNLOAD_TIMEOUT_S = 30  # per connection attempt or read: a silent network fails in seconds
LOADERS = Registry("dataset", "loader", "gradexp/parts/data.py")
loader = LOADERS.add  # @loader("digits"): the loader of dataset=digits


@dataclass
class Arrays:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int | None  # None: regression
    x_test: np.ndarray | None = None  # the test split (None: none), read once after training
    y_test: np.ndarray | None = None
    stream: Callable[[int, int, int], tuple[np.ndarray, np.ndarray]] | None = None
    # stream(seed, step, n): the n fresh training examples of `step` (no x_train then)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_val.shape[1:])

    @property
    def num_outputs(self) -> int:
        """Logits per class, or one predicted value for regression."""
        return 1 if self.num_classes is None else self.num_classes

    def record(self) -> dict:
        """What a run trained on, for its summary.json: one example's shape, the classes (None:
        a regression), the training examples (None: drawn fresh at every step), the held-out,
        and the test split's examples if it has one."""
        record = {"input_shape": list(self.input_shape), "num_classes": self.num_classes,
                  "train_examples": None if self.stream else len(self.x_train),
                  "val_examples": len(self.x_val)}
        if self.x_test is not None:
            record["test_examples"] = len(self.x_test)
        return record


@loader("digits")
def digits(d: DictConfig) -> tuple[np.ndarray, np.ndarray, int]:
    """scikit-learn's 8x8 digits as (8, 8, 1) images in [0, 1]."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[..., None]
    return x, bunch.target.astype(np.int32), 10


@loader("mnist1d")
def mnist1d(d: DictConfig) -> Arrays:
    """MNIST-1D (Greydanus 2020) as the `mnist1d` package generates it: `make_dataset` with its
    published arguments (`get_dataset_args()`: 5000 sequences of 40 steps, 10 classes), `seed`
    replaced by `d.seed` (42: the published set). Examples (40, 1): 40 steps of 1 feature.
    The package's own split: its 4000 training sequences train, its 1000 test ones validate;
    with `d.val_fraction`, that share of the 4000 (drawn by `d.seed`, as `load` draws it)
    validates and the 1000 are the test split."""
    generated = mnist1d_generated(d.seed)

    def part(x, y):
        return x.astype(np.float32)[..., None], y.astype(np.int32)  # copies: the cache stays

    train, test = part(generated["x"], generated["y"]), part(generated["x_test"],
                                                            generated["y_test"])
    if d.get("val_fraction") is None:
        return Arrays(*train, *test, num_classes=10)
    split = split_off(*train, d.val_fraction, d.seed, num_classes=10)
    split.x_test, split.y_test = test
    return split


@functools.lru_cache(maxsize=1)
def mnist1d_generated(seed: int) -> dict:
    """`mnist1d.data.make_dataset` of the package's default arguments with `seed`, cached for
    the process; the global `random` and `np.random` states it seeds and draws from are put
    back, so the runs' own NumPy draws (initialisers seeded from `seed`) stay as they were."""
    from mnist1d.data import get_dataset_args, make_dataset  # never get_dataset: it downloads

    args = get_dataset_args()
    args.seed = seed
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        return make_dataset(args)
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


# ------------------------------------------------------------------- generated, can stream
# A generated dataset is a sampler: `sampler(d)` draws the task's fixed parts (cluster means, a
# teacher network) and its fixed set of `num_examples` from `d.seed`, and returns
# `sample(rng, n) -> (x, y)` with that fixed set. With `dataset.stream` the training batches
# are drawn fresh at every step (`examples`) and the whole fixed set is held out.
Sample = Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]]
Sampler = tuple[Sample, tuple[np.ndarray, np.ndarray]]  # sample, the fixed set
SAMPLERS = Registry("dataset", "sampler", "gradexp/parts/data.py")  # the datasets that can stream
sampler = SAMPLERS.add


@sampler("synthetic")
def synthetic_sampler(d: DictConfig) -> Sampler:
    """Gaussian clusters: mean_c ~ N(0, separation²·I), x = mean_y + N(0, I), y uniform."""
    rng = np.random.default_rng(d.seed)
    means = rng.normal(0.0, d.separation, (d.num_classes, d.num_features))

    def sample(r: np.random.Generator, n: int):
        y = r.integers(0, d.num_classes, n)
        x = means[y] + r.normal(0.0, 1.0, (n, d.num_features))
        return x.astype(np.float32), y.astype(np.int32)

    return sample, sample(rng, d.num_examples)


@sampler("adding")
def adding_sampler(d: DictConfig) -> Sampler:
    """The adding problem, a regression over a long sequence (T = `length` steps),
    x[t] = (v_t, m_t) with m_t = 1 at the two marked steps i and j, else 0:

    le2015 (Le, Jaitly & Hinton 2015; Arjovsky et al. 2016):
        v_t ~ U[0, 1],  i ~ U{0, …, T//2 − 1},  j ~ U{T//2, …, T − 1},  y = v_i + v_j
        Predicting the mean, 1, scores MSE = Var(v_i + v_j) = 2/12 ≈ 0.167.
    pascanu2013 (Pascanu, Mikolov & Bengio 2013, as their code pascanur/trainingRNNs
    addition.py makes it):
        v_t ~ U[0, 1],  i ~ U{0, …, T//10 − 1},  j ~ U{T//10, …, T//2 − 1},  y = (v_i + v_j) / 2
        A sequence is misclassified when its squared error exceeds 0.04: predicting the mean,
        0.5, misclassifies P(|y − 0.5| > 0.2) = 36% of them (MSE = Var(v)/2 = 1/24). The
        paper's text (after Hochreiter & Schmidhuber 1997) has v ~ U[−1, 1]; its code draws
        U[0, 1). Its lengths vary in [T, 1.1·T); here T is fixed.
    """
    pascanu = d.variant == "pascanu2013"
    first_end, second_end = (d.length // 10, d.length // 2) if pascanu else (
        d.length // 2, d.length)

    def sample(r: np.random.Generator, n: int):
        values = r.uniform(0.0, 1.0, (n, d.length))
        rows = np.arange(n)
        first, second = r.integers(0, first_end, n), r.integers(first_end, second_end, n)
        markers = np.zeros((n, d.length))
        markers[rows, first] = markers[rows, second] = 1.0
        x = np.stack([values, markers], axis=-1)
        y = values[rows, first] + values[rows, second]
        return x.astype(np.float32), (y / 2 if pascanu else y).astype(np.float32)

    return sample, sample(np.random.default_rng(d.seed), d.num_examples)


@sampler("teacher")
def teacher_sampler(d: DictConfig) -> Sampler:
    """Teacher-student regression, a task for deep MLPs (F = `num_features`, L = `depth`):

        x ~ N(0, I_F),  h_0 = x,  h_l = tanh(W_l h_{l-1}),  W_l ~ N(0, gain² / fan_in)  (l ≤ L)
        f(x) = w · h_L,  w ~ N(0, 1 / width)
        y = (f(x) − mean f) / std f + noise · N(0, 1)   (mean and std over the fixed set)

    With gain > 1 the teacher is in tanh's chaotic regime (Poole et al. 2016): f is a rough
    function that a deep student needs many layers to fit. The targets have unit variance, so
    the score to beat is MSE ≈ 1 + noise². Gradients explode in the student, not here: the
    squared error's dy = 2(ŷ − y) is unbounded (unlike cross-entropy's), and a deep student with
    large initial weights amplifies it layer by layer.
    """
    rng = np.random.default_rng(d.seed)
    x_fixed = rng.normal(0.0, 1.0, (d.num_examples, d.num_features))  # drawn before the weights
    weights, fan_in = [], d.num_features
    for _ in range(d.depth):
        weights.append(rng.normal(0.0, d.gain / np.sqrt(fan_in), (fan_in, d.width)))
        fan_in = d.width
    readout = rng.normal(0.0, 1.0 / np.sqrt(d.width), d.width)

    def f(x):
        for w in weights:
            x = np.tanh(x @ w)
        return x @ readout

    f_fixed = f(x_fixed)
    mean, std = f_fixed.mean(), f_fixed.std()

    def target(fx, r: np.random.Generator):
        return ((fx - mean) / std + d.noise * r.normal(0.0, 1.0, len(fx))).astype(np.float32)

    def sample(r: np.random.Generator, n: int):
        x = r.normal(0.0, 1.0, (n, d.num_features))
        return x.astype(np.float32), target(f(x), r)

    return sample, (x_fixed.astype(np.float32), target(f_fixed, rng))


@loader("synthetic")
@loader("adding")
@loader("teacher")
def generated(d: DictConfig) -> tuple[np.ndarray, np.ndarray, int | None]:
    """The fixed set of a generated dataset: `num_examples` drawn from `dataset.seed`."""
    _, (x, y) = SAMPLERS[d.name](d)
    return x, y, d.get("num_classes")


synthetic = adding = teacher = generated  # each generated dataset's loader, by its name


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
    return unit_scaled(x), y.astype(np.int32), 10


def unit_scaled(x: np.ndarray) -> np.ndarray:
    """uint8 pixels as float32 in [0, 1], x / 255; any other array as it is."""
    if x.dtype != np.uint8:
        return x
    x = x.astype(np.float32)
    x /= 255.0  # in place: cifar10 is 0.7 GB as float32
    return x


def cache_dir(d: DictConfig) -> Path:
    """Where the files are: `d.cache_dir`, else Keras's own (what keras_home() says + /datasets)."""
    if d.cache_dir is not None:
        return Path(d.cache_dir).expanduser().resolve()
    from keras.src.backend.config import keras_home  # read from KERAS_HOME when Keras loads

    return Path(keras_home()).expanduser() / "datasets"


@contextlib.contextmanager
def keras_files_in(directory: Path, dataset: str, load_data):
    """Run a keras.datasets loader with its files looked up in (or downloaded to) `directory`:
    its module's `get_file` (which reads KERAS_HOME once, when Keras is imported) puts
    `directory` where Keras would put `~/.keras/datasets`; the loader's own code still finds,
    downloads, extracts and parses the files."""
    module = sys.modules[load_data.__module__]
    keras_get_file = module.get_file

    def get_file(fname=None, origin=None, file_hash=None, cache_subdir="datasets",
                 extract=False, **kwargs):
        where = directory / os.path.relpath(cache_subdir, "datasets")  # fashion-mnist/ stays
        # Keras keeps a download as `fname`, but an archive to extract whose `fname` has no dot
        # as `<fname>_archive` (cifar10's .tar.gz: cifar-10-batches-py-target_archive)
        target = where / (f"{fname}_archive" if extract and "." not in fname else fname)
        made = [p for p in (where, *where.parents) if not p.exists()]  # get_file makes them
        if target.exists():  # someone put it here: use it (Keras would delete it on a mismatch)
            file_hash = None
        try:
            return keras_get_file(fname, origin=origin, file_hash=file_hash,
                                  cache_subdir=str(where), extract=extract, **kwargs)
        except Exception as exc:
            if target.exists():
                raise
            for made_dir in made:  # bad input changes nothing on disk: remove what Keras made
                with contextlib.suppress(OSError):  # not empty: then it is not only ours
                    made_dir.rmdir()
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


# --------------------------------------------------------------------------- from outside
@loader("arrays")
def arrays(d: DictConfig) -> Arrays:
    """The user's split: `d.load(**d.kwargs)` (its contract: external_data.CONTRACT), checked
    and typed by `external_data.checked` (the task from the labels, `d.task`, `d.num_classes`)."""
    train, val, test = external_data.user_splits(d)
    return Arrays(*external_data.checked(f"dataset.load={d.load}", train, val, d.task,
                                         d.num_classes, test))


@loader("tfds")
def tfds(d: DictConfig) -> Arrays:
    """The TFDS dataset `d.name` prepared in `d.data_dir`, its splits `d.split_train` and
    `d.split_val` (and `d.split_test`: external_data.tfds_splits), uint8 inputs scaled to
    [0, 1], checked."""
    *splits, num_classes = external_data.tfds_splits(d)
    train, val, test = (split and (unit_scaled(split[0]), split[1]) for split in splits)
    return Arrays(*external_data.checked(f"dataset.name={d.name}", train, val, d.task,
                                         num_classes, test))


def choice(d: DictConfig) -> str:
    """The dataset's choice (conf/dataset/<choice>.yaml), its schema's name: `d.name` but under
    dataset=tfds, whose `name` is the TFDS dataset's."""
    schema = OmegaConf.get_type(d)
    return schema.name if isinstance(schema, type) and issubclass(schema, DatasetConfig) else d.name


def load(d: DictConfig) -> Arrays:
    """The dataset of `cfg.dataset`, split into training and validation by `d.seed` (unless its
    loader returns its own split, as `Arrays`); with `d.stream`, all of it held out and the
    training examples drawn fresh at every step from numpy's generator seeded by (run seed,
    dataset seed, step), so a resumed run draws exactly the examples an uninterrupted one would."""
    if d.get("stream"):
        sample, (x, y) = SAMPLERS[d.name](d)

        def stream(seed: int, step: int, n: int):
            return sample(np.random.default_rng([seed, d.seed, step]), n)

        return Arrays(x[:0], y[:0], x, y, d.get("num_classes"), stream=stream)
    loaded = LOADERS[choice(d)](d)
    if isinstance(loaded, Arrays):  # the dataset's own split
        return loaded
    return split_off(*loaded[:2], d.val_fraction, d.seed, num_classes=loaded[2])


def split_off(x: np.ndarray, y: np.ndarray, val_fraction: float, seed: int,
              num_classes: int | None) -> Arrays:
    """x, y split into training and validation: max(1, round(N · val_fraction)) examples, the
    first of a permutation drawn from `seed`, validate."""
    order = np.random.default_rng(seed).permutation(len(x))
    n_val = max(1, int(round(len(x) * val_fraction)))
    val, train = order[:n_val], order[n_val:]
    return Arrays(x[train], y[train], x[val], y[val], num_classes)


def epoch_order(seed, epoch, n: int) -> tf.Tensor:
    """The order of the n training examples in epoch `epoch` (from 0) of a run of `seed`:
    argsort(stateless_uniform(n, seed=[seed, epoch])), a function of (seed, epoch) alone."""
    noise = tf.random.stateless_uniform([n], seed=tf.stack([tf.cast(seed, tf.int64),
                                                            tf.cast(epoch, tf.int64)]))
    return tf.argsort(noise)


def batch_indices(seed, n: int, batch_size: int, first_step, steps: int) -> tf.Tensor:
    """[steps, B]: indices into the n training examples of the batches of steps first_step + 1
    ... first_step + steps. The batch of step t: positions (t − 1)·B ... t·B − 1 of the epochs'
    orders (`epoch_order`) laid end to end."""
    first = tf.cast(first_step, tf.int64) * batch_size
    count = steps * batch_size
    first_epoch = first // n
    epochs = tf.range(first_epoch, (first + count - 1) // n + 1)
    orders = tf.map_fn(lambda e: epoch_order(seed, e, n), epochs,
                       fn_output_signature=tf.TensorSpec([n], tf.int32))
    start = first - first_epoch * n
    return tf.reshape(tf.reshape(orders, [-1])[start:start + count], [steps, batch_size])


def examples(a: Arrays, seeds, batch_size: int, first_step, steps: int):
    """The batches of `steps` steps from `first_step` of runs of `seeds` ([K]) as (x_source,
    y_source, indices [K, steps, B]): run k's batch of step first_step + 1 + i is
    x_source[indices[k, i]]. A stream's batch of step t + 1 is `a.stream(seed, t, B)`."""
    if a.stream is None:
        if batch_size > len(a.x_train):
            raise ConfigError(f"trainer.batch_size={batch_size}: larger than the "
                              f"{len(a.x_train)} training examples")
        indices = tf.map_fn(
            lambda seed: batch_indices(seed, len(a.x_train), batch_size, first_step, steps),
            seeds, fn_output_signature=tf.TensorSpec([steps, batch_size], tf.int32))
        return tf.constant(a.x_train), tf.constant(a.y_train), indices

    def draw(seeds, first_step):
        drawn = [a.stream(int(seed), int(first_step) + i, batch_size)
                 for seed in seeds for i in range(steps)]
        return (np.concatenate([x for x, _ in drawn]).astype(a.x_val.dtype),
                np.concatenate([y for _, y in drawn]).astype(a.y_val.dtype))

    x, y = tf.numpy_function(draw, [seeds, first_step], (tf.as_dtype(a.x_val.dtype),
                                                          tf.as_dtype(a.y_val.dtype)),
                             stateful=False)
    k = tf.shape(seeds)[0]
    x = tf.ensure_shape(x, [None, *a.x_val.shape[1:]])
    y = tf.ensure_shape(y, [None, *a.y_val.shape[1:]])
    return x, y, tf.reshape(tf.range(k * steps * batch_size), [k, steps, batch_size])


def training_batches(a: Arrays, batch_size: int, seed: int,
                     start_step: int = 0) -> tf.data.Dataset:
    """Endless training batches from the one of `start_step` + 1, as a tf.data.Dataset
    (model.fit's input): the trainer's own (`examples`), drawn 64 steps' at a time."""
    seeds, steps = tf.constant([seed], tf.int64), 64

    @tf.autograph.experimental.do_not_convert  # no control flow: tracing as written is faster
    def block(first_step):
        x, y, indices = examples(a, seeds, batch_size, first_step, steps)
        return tf.data.Dataset.from_tensor_slices((tf.gather(x, indices[0]),
                                                   tf.gather(y, indices[0])))

    return tf.data.Dataset.range(start_step, 2**62, steps).flat_map(block).prefetch(2)


VAL_BATCH = 1024  # validation examples per forward pass of an evaluation (step.py `evaluate`)


def validation_set(a: Arrays) -> tuple[tf.Tensor, tf.Tensor]:
    """The held-out examples and targets, in order, as tensors (see `evaluate` in step.py)."""
    return tf.constant(a.x_val), tf.constant(a.y_val)


def sealed_test_set(a: Arrays) -> tuple[tf.Tensor, tf.Tensor]:
    """The test split's examples and targets as tensors: for the one evaluation of the final
    weights after training (gradexp/train.py `evaluate_test_split`), never during it."""
    return tf.constant(a.x_test), tf.constant(a.y_test)
