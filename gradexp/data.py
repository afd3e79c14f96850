"""Datasets (arrays in memory) and their tf.data pipelines.

Each loader returns (x, y, num_classes); num_classes None means regression (y is a float per
example, the model has one output).
Every dataset is made or read here without a download: `synthetic` is generated from
`dataset.seed`, `digits` ships inside the scikit-learn wheel. The split into training and
validation depends on `dataset.seed` only, so runs that differ in `seed` see the same data
in a different order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig

from gradexp._tf import tf


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


def synthetic(d: DictConfig) -> tuple[np.ndarray, np.ndarray, int]:
    """Gaussian clusters: mean_c ~ N(0, separation²·I), x = mean_y + N(0, I), y uniform."""
    rng = np.random.default_rng(d.seed)
    means = rng.normal(0.0, d.separation, (d.num_classes, d.num_features))
    y = rng.integers(0, d.num_classes, d.num_examples)
    x = means[y] + rng.normal(0.0, 1.0, (d.num_examples, d.num_features))
    return x.astype(np.float32), y.astype(np.int32), d.num_classes


def digits(d: DictConfig) -> tuple[np.ndarray, np.ndarray, int]:
    """scikit-learn's 8x8 digits as (8, 8, 1) images in [0, 1]."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[..., None]
    return x, bunch.target.astype(np.int32), 10


LOADERS = {"synthetic": synthetic, "digits": digits}


def load(d: DictConfig) -> Arrays:
    """The dataset of `cfg.dataset`, split into training and validation by `d.seed`."""
    x, y, num_classes = LOADERS[d.name](d)
    order = np.random.default_rng(d.seed).permutation(len(x))
    n_val = max(1, int(round(len(x) * d.val_fraction)))
    val, train = order[:n_val], order[n_val:]
    return Arrays(x[train], y[train], x[val], y[val], num_classes)


def pipelines(a: Arrays, batch_size: int, seed: int) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """Endless shuffled training batches (order from `seed`) and one pass of validation batches."""
    if batch_size > len(a.x_train):
        raise ValueError(f"trainer.batch_size={batch_size}: larger than the "
                         f"{len(a.x_train)} training examples")
    train = (tf.data.Dataset.from_tensor_slices((a.x_train, a.y_train))
             .shuffle(len(a.x_train), seed=seed, reshuffle_each_iteration=True)
             .repeat()
             .batch(batch_size, drop_remainder=True)
             .prefetch(tf.data.AUTOTUNE))
    val = (tf.data.Dataset.from_tensor_slices((a.x_val, a.y_val))
           .batch(batch_size)
           .cache()
           .prefetch(tf.data.AUTOTUNE))
    return train, val
