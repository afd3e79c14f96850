"""experiments/mnist1d/paper_models.py: the MNIST-1D paper's models, written the user's way,
have the paper code's parameter counts (greydanus/mnist1d notebooks/models.py, PyTorch) and
the shapes it computes."""

from __future__ import annotations

import sys

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
