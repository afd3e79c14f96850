"""The test split (trainer.test): a dataset's third split, read once after the last step, its
figures those of the final weights; never read during training; asked for where there is none,
one line naming trainer.test. And the summary's test figures."""

from __future__ import annotations

import json
import logging
import sys

import numpy as np
import pandas as pd
import pytest
from fake_runs import ending_at, write_run

from conftest import gradexp
from gradexp import config
from gradexp.config import ConfigError
from gradexp.parts import data, external_data

# The user's module: arrays from an .npz file (a test split if the file has one) and a linear
# model, the logits x·W + b.
USER_MODULE = '''
import keras
import numpy as np


def load(path, test=True):
    f = np.load(path)
    parts = [(f["x_train"], f["y_train"]), (f["x_val"], f["y_val"])]
    if test and "x_test" in f:
        parts.append((f["x_test"], f["y_test"]))
    return tuple(parts)


def linear(input_shape, num_outputs):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, keras.layers.Dense(num_outputs, name="linear")(inputs))
'''
RUN = ["model=keras", "model.build=my_split:linear", "dataset=arrays",
       "dataset.load=my_split:load", "layer.positions=[]", "trainer.steps=30",
       "trainer.log_every=10", "trainer.eval_every=10", "trainer.histogram_every=0",
       "trainer.batch_size=16"]
TEST_SPLITS = ("datasets with one: mnist1d with dataset.val_fraction set, tfds with "
               "dataset.split_test, arrays whose load returns a third part (x_test, y_test)")


def arrays_file(path, regression=False, test=True, x_test=None):
    """data.npz: 64 training, 16 validation and (`test`) 20 test examples of 4 features; 3
    classes, or float targets."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(100, 4)).astype(np.float32)
    y = (x @ [1.0, -2.0, 0.5, 0.0]).astype(np.float32) if regression else rng.integers(0, 3, 100)
    parts = {"x_train": x[:64], "y_train": y[:64], "x_val": x[64:80], "y_val": y[64:80]}
    if test:
        parts |= {"x_test": x[80:] if x_test is None else x_test, "y_test": y[80:]}
    np.savez(path, **parts)
    return path


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_split.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_split", raising=False)
    yield tmp_path
    sys.modules.pop("my_split", None)


def trained(make_cfg, run_dir, *overrides):
    from gradexp.train import train

    cfg = make_cfg(*RUN, *overrides)
    config.validate(cfg)
    run_dir.mkdir()
    return train(cfg, run_dir)


def final_weights(run_dir):
    """The linear model's kernel and bias in the run's last checkpoint."""
    from gradexp._tf import tf

    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints"))
    return [reader.get_tensor(f"optimizer/_trainable_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE")
            for i in (0, 1)]


# ------------------------------------------------------------------------- the final figures
@pytest.mark.slow
@pytest.mark.parametrize("regression", [False, True])
def test_the_test_figures_are_the_final_weights_on_the_test_arrays(make_cfg, user_module,
                                                                   regression, caplog):
    caplog.set_level(logging.INFO, logger="gradexp")
    npz = arrays_file(user_module / "data.npz", regression)
    summary = trained(make_cfg, user_module / "run", f"dataset.kwargs.path={npz}",
                      "trainer.test=true")
    assert summary["status"] == "completed" and summary["data"]["test_examples"] == 20
    kernel, bias = final_weights(user_module / "run")
    f = np.load(npz)
    out = f["x_test"].astype(np.float64) @ kernel + bias  # by hand, in float64
    if regression:  # the squared error of the one output; no accuracy
        assert summary["test_loss"] == pytest.approx(np.mean((out[:, 0] - f["y_test"]) ** 2),
                                                     rel=1e-5)
        assert np.isnan(summary["test_accuracy"])
        return
    log_p = out - out.max(axis=1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
    loss = -np.mean(log_p[np.arange(20), f["y_test"]])
    assert summary["test_loss"] == pytest.approx(loss, rel=1e-5)
    assert summary["test_accuracy"] == pytest.approx(np.mean(out.argmax(axis=1) == f["y_test"]),
                                                     rel=1e-6)  # k/20 in float32
    assert 0 < summary["test_accuracy"] < 1  # a number that tells right from wrong
    written = json.loads((user_module / "run" / "summary.json").read_text())
    assert written["test_accuracy"] == summary["test_accuracy"]
    log = caplog.text
    assert log.count("the test split (20 examples, read once)") == 1
    assert f"test accuracy {summary['test_accuracy']:.4f}" in log


@pytest.mark.slow
def test_the_test_split_is_not_read_during_training(make_cfg, user_module):
    """Test inputs of NaN would poison any figure they reached: the run's every step and
    evaluation are those of a run without a test split, bit for bit, and the one evaluation
    at the end is NaN (null)."""
    poisoned = arrays_file(user_module / "poisoned.npz", x_test=np.full((20, 4), np.nan))
    trained(make_cfg, user_module / "tested", f"dataset.kwargs.path={poisoned}",
            "trainer.test=true")
    trained(make_cfg, user_module / "plain", f"dataset.kwargs.path={poisoned}",
            "dataset.kwargs.test=false")
    tested, plain = (json.loads((user_module / run / "summary.json").read_text())
                     for run in ("tested", "plain"))
    assert tested["test_loss"] is None  # NaN, as JSON: the poison reached this figure only
    assert tested["data"]["test_examples"] == 20
    assert "test_loss" not in plain and "test_examples" not in plain["data"]
    tables = [pd.read_csv(user_module / run / "metrics.csv") for run in ("tested", "plain")]
    pd.testing.assert_frame_equal(*tables)
    assert np.isfinite(tables[0]["loss/train"]).all() and len(tables[0]) == 30
    for name in ("loss/val", "accuracy/val"):  # evaluated at steps 10, 20, 30, all finite
        assert np.isfinite(tables[0][name].dropna()).sum() == 3
    for name in ("final_loss", "val_loss", "val_accuracy"):
        assert tested[name] == plain[name]
    for a, b in zip(*(final_weights(user_module / run) for run in ("tested", "plain")),
                    strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------ bad configs
def test_a_dataset_without_a_test_split_is_refused_before_tensorflow(make_cfg):
    for overrides, dataset in ((["dataset=digits"], "digits"),
                               (["dataset=mnist1d"], "mnist1d"),  # its test sequences validate
                               (["dataset=tfds", "dataset.name=mnist"], "tfds")):
        with pytest.raises(ConfigError) as error:
            config.validate(make_cfg(*overrides, "trainer.test=true"))
        assert str(error.value) == (f"trainer.test=true: dataset={dataset} has no test "
                                    f"split; {TEST_SPLITS}")
    for overrides in (["dataset=mnist1d", "dataset.val_fraction=0.1"],
                      ["dataset=tfds", "dataset.name=mnist", "dataset.split_test=test"],
                      ["dataset=arrays", "dataset.load=my:load"]):  # loading tells
        config.validate(make_cfg(*overrides, "trainer.test=true"))
    with pytest.raises(ConfigError, match=r"^dataset.val_fraction=1.5: must be between 0 and 1"):
        config.validate(make_cfg("dataset=mnist1d", "dataset.val_fraction=1.5"))


def test_asking_for_a_test_split_that_is_not_there_exits_2_in_one_line(tmp_path, monkeypatch,
                                                                      capsys):
    from conftest import exit_of

    monkeypatch.chdir(tmp_path)
    assert exit_of(monkeypatch, "dataset=digits", "trainer.test=true", "hydra.run.dir=run") == 2
    assert capsys.readouterr().err == (f"error: trainer.test=true: dataset=digits has no test "
                                       f"split; {TEST_SPLITS}\n")
    assert not (tmp_path / "run" / "summary.json").exists()  # refused before it started


@pytest.mark.slow
def test_a_loader_without_a_test_part_exits_2_naming_trainer_test(user_module):
    npz = arrays_file(user_module / "data.npz", test=False)
    result = gradexp("gradexp.train", *RUN, f"dataset.kwargs.path={npz}", "trainer.test=true",
                     "hydra.run.dir=run", cwd=user_module)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        f"error: trainer.test=true: dataset.load=my_split:load returned no test split; "
        f"{TEST_SPLITS}")
    assert not (user_module / "run" / "metrics.csv").exists()  # nothing trained


# ------------------------------------------------------------------------------- the splits
def test_a_third_part_is_the_test_split_checked_like_the_others(make_cfg, user_module):
    npz = arrays_file(user_module / "data.npz")
    a = data.load(make_cfg("dataset=arrays", "dataset.load=my_split:load",
                           f"dataset.kwargs.path={npz}").dataset)
    f = np.load(npz)
    np.testing.assert_array_equal(a.x_test, f["x_test"])
    np.testing.assert_array_equal(a.y_test, f["y_test"])
    assert a.x_test.dtype == np.float32 and a.y_test.dtype == np.int32
    assert a.record()["test_examples"] == 20
    two = data.load(make_cfg("dataset=arrays", "dataset.load=my_split:load",
                             f"dataset.kwargs.path={npz}", "dataset.kwargs.test=false").dataset)
    assert two.x_test is None and "test_examples" not in two.record()
    x, y = np.zeros((4, 3)), np.array([0, 1, 2, 1])
    for test, expected in (
            ((np.zeros((4, 5)), y), "here: training examples have shape (3,), test examples "
                                    "(5,); they must have one shape"),
            ((x, y * 0.5), "here: y_train holds integers, y_test floats; both must be integers "
                           "(class labels) or both floats (regression targets)"),
            ((x, y + 1), "here: y_test holds 3, not one of the 3 classes (0 to 2) of training "
                         "and validation"),
            ((x, y[:3]), "here: x_test has 4 examples, y_test 3; they must have as many")):
        with pytest.raises(ConfigError) as error:
            external_data.checked("here", (x, y), (x, y), test=test)
        assert str(error.value) == expected


@pytest.mark.slow
def test_mnist1d_with_a_validation_fraction_holds_its_test_sequences_out(make_cfg):
    d = make_cfg("dataset=mnist1d", "dataset.val_fraction=0.1").dataset
    a, package = data.load(d), data.load(make_cfg("dataset=mnist1d").dataset)
    assert (len(a.x_train), len(a.x_val), len(a.x_test)) == (3600, 400, 1000)
    np.testing.assert_array_equal(a.x_test, package.x_val)  # the package's test sequences
    np.testing.assert_array_equal(a.y_test, package.y_val)
    order = np.random.default_rng(42).permutation(4000)  # drawn by dataset.seed, as `load`
    np.testing.assert_array_equal(a.x_val, package.x_train[order[:400]])
    np.testing.assert_array_equal(a.x_train, package.x_train[order[400:]])
    assert package.x_test is None


# ------------------------------------------------------------------------------- the summary
def test_the_summary_compares_the_test_figures_and_leaves_a_diverged_run_out(tmp_path):
    from gradexp.analysis.compare import summarize
    from gradexp.analysis.reports import printed_metrics
    from gradexp.analysis.runs import load_runs

    accuracy = {("mlp", 0): 0.5, ("mlp", 1): 0.7, ("cnn", 0): 0.8, ("cnn", 1): 0.9}
    for (model, seed), value in accuracy.items():
        write_run(tmp_path / f"{model}_{seed}", [f"model={model}", f"seed={seed}"],
                  ending_at(1.0), summary={"test_loss": 1 - value, "test_accuracy": value})
    write_run(tmp_path / "cnn_2", ["model=cnn", "seed=2"], ending_at(1.0), status="diverged",
              summary={"test_loss": None, "test_accuracy": 0.1})
    runs_table, tidy = summarize(load_runs(tmp_path)[0], baseline={"model": "mlp"})
    assert runs_table["test_accuracy"].tolist() == [0.8, 0.9, 0.1, 0.5, 0.7]
    rows = tidy[tidy["metric"] == "test_accuracy"].set_index("model")
    assert rows.at["mlp", "mean"] == pytest.approx(0.6) and rows.at["mlp", "n"] == 2
    assert rows.at["cnn", "mean"] == pytest.approx(0.85) and rows.at["cnn", "n"] == 2
    assert rows.at["cnn", "diff_mean"] == pytest.approx(0.25)  # another model: unpaired
    assert rows.at["cnn", "test"] == "mann-whitney" and rows.at["cnn", "n_paired"] == 0
    assert rows.at["cnn", "better"] == "higher"
    assert tidy.loc[tidy["metric"] == "test_loss", "better"].eq("lower").all()
    assert "test_accuracy" in printed_metrics(tidy)
    write_run(tmp_path / "other" / "mlp_0", ["model=mlp", "seed=0"], ending_at(1.0))
    without, tidy = summarize(load_runs(tmp_path / "other")[0])
    assert "test_accuracy" not in without and not tidy["metric"].str.startswith("test").any()
