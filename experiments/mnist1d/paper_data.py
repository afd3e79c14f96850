"""MNIST-1D as the paper's study needs it, written as a user writes data for gradexp
(`dataset=arrays`, a function returning ((x_train, y_train), (x_val, y_val), (x_test, y_test))):

    regular    the mnist1d package's published set (`make_dataset` of `get_dataset_args()`,
               seed 42): its 4,000 training sequences of 40 steps, split into training and
               validation (`val_fraction`, a fixed shuffle of `split_seed`)
    shuffled   the same with the 40 positions permuted, one permutation (`permutation_seed`) for
               every sequence: the paper's "shuffle", the spatial dimension shuffled as in Zhang
               et al. (2017), which leaves a logistic regression or an MLP as they were and takes
               a CNN's or a GRU's notion of neighbouring steps away

    test       the package's 1,000 test sequences (the same permutation under `shuffle`): the
               test split, which a run reads once, after its last step, under trainer.test
               (paper_conf/experiment/mnist1d_paper.yaml); nothing reads it during training

Examples are (40, 1) float32, labels int32.
"""

from __future__ import annotations

import functools
import random

import numpy as np

LENGTH = 40


@functools.lru_cache(maxsize=1)
def generated(seed: int = 42) -> dict:
    """`make_dataset` of the package's published arguments with `seed` (never `get_dataset`,
    which downloads). It seeds and draws from the global `random` and `np.random` generators:
    their states are put back, so nothing else in the process draws differently."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.seed = seed
    states = random.getstate(), np.random.get_state()
    try:
        return make_dataset(args)
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])


def permutation(shuffle: bool, permutation_seed: int = 0) -> np.ndarray:
    """The order of the 40 positions: as they are, or one fixed random permutation."""
    if not shuffle:
        return np.arange(LENGTH)
    return np.random.default_rng(permutation_seed).permutation(LENGTH)


def as_examples(x: np.ndarray, y: np.ndarray, order: np.ndarray):
    return x[:, order].astype(np.float32)[..., None], y.astype(np.int32)


def mnist1d(shuffle: bool = False, val_fraction: float = 0.1, split_seed: int = 0,
            permutation_seed: int = 0, data_seed: int = 42):
    """((x_train, y_train), (x_val, y_val)) from the package's 4,000 training sequences, and
    (x_test, y_test), its 1,000 test sequences."""
    data = generated(data_seed)
    order_40 = permutation(shuffle, permutation_seed)
    x, y = as_examples(data["x"], data["y"], order_40)
    order = np.random.default_rng(split_seed).permutation(len(x))
    n_val = round(val_fraction * len(x))
    val, train = order[:n_val], order[n_val:]
    return ((x[train], y[train]), (x[val], y[val]),
            as_examples(data["x_test"], data["y_test"], order_40))

