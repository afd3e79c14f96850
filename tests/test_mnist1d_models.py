"""experiments/mnist1d/paper_models.py: the MNIST-1D paper's models, written the user's way,
have the paper code's parameter counts (greydanus/mnist1d notebooks/models.py, PyTorch) and
the shapes it computes; paper_data.py splits validation from the training set, never returns
the test set, and shuffles the 40 positions of every sequence alike."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import REPO

# PyTorch's counts, by hand: Linear(40, 10) = 410; MLP 40·100+100 + 100·100+100 + 100·10+10;
# Conv1d(1, 25, 5) 150 + 2 × Conv1d(25, 25, 3) 1,900 + Linear(125, 10) 1,260; GRU(1, 6), both
# ways: 2 × 3 × (6·1 + 6·6 + 6 + 6) = 324, + Linear(480, 10) 4,810
COUNTS = {"logistic": 410, "mlp": 15_210, "cnn": 5_210, "gru": 5_134}


@pytest.mark.parametrize("name", COUNTS)
def test_the_papers_models_have_its_parameter_counts(name, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "experiments" / "mnist1d"))
    monkeypatch.delitem(sys.modules, "paper_models", raising=False)
    import paper_models

    model = getattr(paper_models, name)((40, 1), 10)
    assert model.count_params() == COUNTS[name]
    assert model.output_shape == (None, 10)
    if name == "cnn":  # lengths 40 -> 19 -> 10 -> 5, as the paper's linear_in = 125 says
        assert [model.get_layer(f"conv_{i}").output.shape[1] for i in (1, 2, 3)] == [19, 10, 5]


@pytest.fixture(scope="module")
def paper_data():
    path = str(REPO / "experiments" / "mnist1d")
    sys.path.insert(0, path)
    sys.modules.pop("paper_data", None)
    try:
        import paper_data

        yield paper_data
    finally:
        sys.path.remove(path)
        sys.modules.pop("paper_data", None)


def test_the_validation_set_is_split_from_the_training_set(paper_data):
    """3,600 + 400 of the package's 4,000 training sequences, disjoint; its 1,000 test
    sequences are in neither split: they are the third, the test split, as the package has
    them."""
    data = paper_data.generated(42)
    (x_train, y_train), (x_val, y_val), (x_test, y_test) = paper_data.mnist1d()
    assert (x_train.shape, x_val.shape) == ((3600, 40, 1), (400, 40, 1))
    assert (x_train.dtype, y_train.dtype) == (np.float32, np.int32)
    rows = {row.tobytes() for row in data["x"].astype(np.float32)}
    both = np.concatenate([x_train, x_val])[..., 0]
    assert {row.tobytes() for row in both} == rows and len(rows) == 4000
    test = {row.tobytes() for row in data["x_test"].astype(np.float32)}
    assert not test & {row.tobytes() for row in both}
    np.testing.assert_array_equal(x_test[..., 0], data["x_test"].astype(np.float32))
    np.testing.assert_array_equal(y_test, data["y_test"])
    assert (x_test.dtype, y_test.dtype) == (np.float32, np.int32)
    labels = dict(zip((r.tobytes() for r in data["x"].astype(np.float32)), data["y"],
                      strict=True))
    assert all(labels[r.tobytes()] == y for r, y in zip(x_val[..., 0], y_val, strict=True))


def test_shuffled_data_permute_every_sequence_alike(paper_data):
    """The same examples in the same split, each with its positions in one fixed order that
    is not the original one; the labels stay."""
    (x_train, y_train), (x_val, y_val), (x_test, y_test) = paper_data.mnist1d()
    (s_train, s_train_y), (s_val, s_val_y), (s_test, s_test_y) = paper_data.mnist1d(shuffle=True)
    order = paper_data.permutation(True)
    assert sorted(order) == list(range(40)) and (order != np.arange(40)).any()
    np.testing.assert_array_equal(s_train, x_train[:, order])
    np.testing.assert_array_equal(s_val, x_val[:, order])
    np.testing.assert_array_equal(s_test, x_test[:, order])  # the test split alike
    np.testing.assert_array_equal(s_test_y, y_test)
    np.testing.assert_array_equal(s_train_y, y_train)
    np.testing.assert_array_equal(s_val_y, y_val)
    other = paper_data.mnist1d(shuffle=True, permutation_seed=1)[0][0]
    assert not np.array_equal(other, s_train)


def test_the_paper_codes_runs_are_read_from_a_notebooks_printed_lines(monkeypatch):
    """paper_notebook.printed on a notebook written the way the paper's are: a cell training
    on `data` then one on `data_shuff`, each printing "Initialized <Model> model" and a line
    per 1,000 steps; the shuffled cell's rows are the shuffled data, each model its own rows."""
    monkeypatch.syspath_prepend(str(REPO / "experiments" / "mnist1d"))
    monkeypatch.delitem(sys.modules, "paper_notebook", raising=False)
    import paper_notebook

    def lines(model, *accuracies):
        return [f"Initialized {model} model with 410 parameters\n"] + [
            f"step {1000 * (i + 1)}, dt 0.57s, train_loss 1.5e+00, test_loss 1.6e+00, "
            f"train_acc 37.0, test_acc {a}\n" for i, a in enumerate(accuracies)]

    notebook = {"cells": [
        {"cell_type": "markdown", "source": ["# data_shuff in prose, no outputs"]},
        {"cell_type": "code", "source": ["results = train_model(data, model, args)"],
         "outputs": [{"text": lines("ConvBase", 90.7, 92.5) + ["\n"]
                      + lines("LinearBase", 32.4)}]},
        {"cell_type": "code", "source": ["train_model(data_shuff, model, args)"],
         "outputs": [{"text": lines("GRUBase", 56.8, 53.3)}]}]}
    assert paper_notebook.printed(notebook) == [
        {"model": "cnn", "data": "regular", "step": 1000, "test_accuracy": 90.7},
        {"model": "cnn", "data": "regular", "step": 2000, "test_accuracy": 92.5},
        {"model": "logistic", "data": "regular", "step": 1000, "test_accuracy": 32.4},
        {"model": "gru", "data": "shuffled", "step": 1000, "test_accuracy": 56.8},
        {"model": "gru", "data": "shuffled", "step": 2000, "test_accuracy": 53.3}]
