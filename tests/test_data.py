"""The generated datasets against their definitions."""

from __future__ import annotations

import numpy as np
import pytest

from gradexp import data


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
