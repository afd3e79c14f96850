"""gradexp.keras.Telemetry: model.fit writes gradexp's run directory. A fit step's row against
gradexp's own step on the same weights and batch; a clipped and an unclipped fit run and a
gradexp run summarized in one table, their event files read by TensorBoard's own loader; a
diverging fit recorded as diverged; what the callback refuses, in one line."""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd
import pytest

from conftest import event_scalars, events, gradexp
from gradexp._tf import keras
from gradexp.analysis.runs import read_metrics
from gradexp.config import ConfigError
from gradexp.keras import Telemetry
from gradexp.parts.layers import ClipGradient
from gradexp.runs import rundir
from gradexp.training.step import metric_names

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

GLOBAL = metric_names([])  # the columns of every step but the clip layers'
EXACT = ("param_clip/threshold", "param_clip/clipped", "learning_rate")  # set, not computed


def regression(n=320, seed=0):
    """y = 3·x·w: targets large enough that clip=0.1 bites under the batch-mean loss."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    return x, (x @ rng.normal(size=8) * 3).astype(np.float32)


def two_clip_layers(clip, seed=0, model_class=keras.Model):
    """A Functional MLP with a ClipGradient (±clip, None: unbounded) after each hidden layer."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8,))
    x = inputs
    for name in ("dense_1", "dense_2"):
        x = keras.layers.Dense(16, activation="relu", name=name)(x)
        x = ClipGradient(None if clip is None else -clip, clip, name=f"clip_{name}")(x)
    return model_class(inputs, keras.layers.Dense(1, name="head")(x))


def fit_run(run_dir, clip, lr=0.01, jit_compile=True, epochs=1, model_class=keras.Model, **fit):
    """A regression fit with the callback into `run_dir`; returns the model and its history."""
    x, y = regression()
    model = two_clip_layers(clip, model_class=model_class)
    model.compile(keras.optimizers.SGD(lr), "mse", jit_compile=jit_compile)
    history = model.fit(x, y, batch_size=8, epochs=epochs, verbose=0,
                        callbacks=[Telemetry(run_dir, seed=0)], **fit)
    return model, history


def summary_of(run_dir):
    return json.loads((run_dir / rundir.SUMMARY).read_text())


# ------------------------------------------------------------ the row against gradexp's step
def fit_and_own_rows(cfg, run_dir, optimizer, steps=3, **compile_kwargs):
    """gradexp's model of `cfg` (seeded), trained by model.fit with `optimizer` and the callback
    for `steps` batches of trainer.batch_size, unshuffled; before each batch its weights are
    kept, and gradexp's own step of `cfg` is run on them and on that batch. Returns (the fit's
    metrics.csv, gradexp's rows as {name: value}, the clip layers' positions)."""
    from gradexp.parts import data
    from gradexp.training.step import State, make_step

    batch = cfg.trainer.batch_size
    arrays = data.load(cfg.dataset)
    keras.utils.set_random_seed(cfg.seed)  # the weights, hence the norms below, are known
    compiled = make_step(cfg, arrays)
    model = compiled.model
    x, y = arrays.x_train[:batch * steps], arrays.y_train[:batch * steps]
    before = []

    class KeepWeights(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            before.append([v.numpy() for v in model.variables])

    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  **compile_kwargs)
    model.fit(x, y, batch_size=batch, shuffle=False, verbose=0,
              callbacks=[KeepWeights(), Telemetry(run_dir)])
    optimizer_values = [v.numpy() for v in compiled.optimizer.variables]
    own = []
    for k in range(steps):
        state = State(before[k], optimizer_values, compiled.initial_carry())
        _, row, _ = compiled.train(state, x[k * batch:(k + 1) * batch],
                                   y[k * batch:(k + 1) * batch], measure=True)
        own.append(dict(zip(compiled.names, row.numpy(), strict=True)))
    positions = [n.split("/")[1] for n in compiled.names if n.startswith("clip_fraction/")]
    return read_metrics(run_dir / rundir.METRICS), own, positions


def assert_same_rows(table, own, positions):
    """Every column of each fit row is gradexp's, to float32 rounding; those set, not
    computed, exactly."""
    names = metric_names(positions)
    assert list(table.columns) == ["step", *names, "loss/val", "accuracy/val"]
    assert table["step"].tolist() == list(range(1, len(own) + 1))
    for k, row in enumerate(own):
        for name in names:
            fit_value = np.float32(table[name].iloc[k])
            if name in EXACT:
                assert fit_value == row[name], (k, name)
            else:
                np.testing.assert_allclose(fit_value, row[name], rtol=1e-6, err_msg=f"{k} {name}")


@pytest.mark.parametrize("mode", [{"jit_compile": True}, {"jit_compile": False},
                                  {"run_eagerly": True}], ids=["xla", "graph", "eager"])
def test_a_fit_step_logs_what_gradexp_own_step_measures_on_the_same_weights_and_batch(
        make_cfg, tmp_path, mode):
    """An MLP with clip layers at dense_1 and dense_2, Keras's SGD with global_clipnorm against
    gradexp's step with loss_reduction=mean, clipping=global_norm, the same bound. Three steps:
    the layers' statistics start from zero at every step."""
    lr, bound = 0.1, 0.474
    cfg = make_cfg("model.depth=2", "model.width=16", "clip=0.001", f"optimizer.learning_rate={lr}",
                   "trainer.loss_reduction=mean", "trainer.batch_size=16",
                   "clipping=global_norm", f"clipping.max_norm={bound}")
    table, own, positions = fit_and_own_rows(
        cfg, tmp_path, keras.optimizers.SGD(lr, momentum=0.9, global_clipnorm=bound), **mode)
    assert positions == ["dense_1", "dense_2"]
    assert_same_rows(table, own, positions)
    for row in own:  # the bounds are at work in both layers
        assert 0 < row["clip_fraction/dense_1"] < 1 and 0 < row["clip_fraction/dense_2"] < 1
        assert row["grad_norm/dense_2/post"] < row["grad_norm/dense_2/pre"]
    # global_clipnorm bit on some step and not on another: both branches compared
    assert set(table["param_clip/clipped"]) == {0.0, 1.0}
    assert (table["param_clip/threshold"] == np.float32(bound)).all()


def test_a_clip_layer_inside_the_recurrence_adds_up_over_the_time_steps(make_cfg, tmp_path):
    """gradexp's RNN, a clip layer in its cell (applied at every time step, inside Keras's
    while loop) and one after it; Adam with clipnorm (gradexp's clipping=norm)."""
    cfg = make_cfg("model=rnn", "dataset=digits", "model.units=8", "clip=0.01",
                   "trainer.loss_reduction=mean",
                   "trainer.batch_size=16", "optimizer=adam", "optimizer.learning_rate=0.01",
                   "clipping=norm", "clipping.max_norm=0.1")
    table, own, positions = fit_and_own_rows(
        cfg, tmp_path, keras.optimizers.Adam(0.01, clipnorm=0.1), steps=2)
    assert positions == ["rnn_1_state", "rnn_1"]
    assert_same_rows(table, own, positions)
    assert (table["clip_fraction/rnn_1_state"] > 0).all()


# --------------------------------------------------- fit runs and a gradexp run, summarized
def test_fit_runs_and_a_gradexp_run_are_summarized_in_one_table(tmp_path):
    """Two fit runs of 40 steps, clip=0.1 and unclipped, and a gradexp run, in one folder:
    summarize counts the three, compares clip=0.1 with clip=null seed by seed, and puts the
    gradexp run in a group of its own. Each fit run's event file holds metrics.csv's values
    under the same tags, read by TensorBoard's loader."""
    sweep = tmp_path / "sweep"
    for name, clip in (("fit_clipped", 0.1), ("fit_unclipped", None)):
        fit_run(sweep / name, clip, epochs=2, validation_split=0.2)
    done = gradexp("gradexp.train", "trainer.steps=20", "trainer.log_every=10",
                   "trainer.eval_every=20", "trainer.histogram_every=0", "model.width=8",
                   "clip=0.1", f"hydra.run.dir={sweep / 'gradexp_run'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr

    clipped, unclipped = (read_metrics(sweep / n / rundir.METRICS)
                          for n in ("fit_clipped", "fit_unclipped"))
    assert len(clipped) == len(unclipped) == 64  # 256 training examples / 8, two epochs
    assert clipped["clip_fraction/dense_2"].mean() > 0.5
    assert (unclipped["clip_fraction/dense_2"] == 0).all()
    assert clipped["loss/train"].iloc[-6:].mean() > 2 * unclipped["loss/train"].iloc[-6:].mean()
    evaluated = clipped.dropna(subset=["loss/val"])["step"].tolist()
    assert evaluated == [32, 64]  # each epoch's last step
    for name in ("fit_clipped", "fit_unclipped"):
        summary = summary_of(sweep / name)
        assert summary["status"] == rundir.COMPLETED and summary["steps"] == 64
        table = read_metrics(sweep / name / rundir.METRICS)
        assert summary["final_loss"] == pytest.approx(table["loss/train"].iloc[-6:].mean())
        assert summary["val_loss"] == pytest.approx(table["loss/val"].iloc[-1])
        assert summary["config"]["runner"] == "keras.fit"
        assert (sweep / name / rundir.PROVENANCE).is_file()
        acc = events(sweep / name)
        by_step = table.set_index("step")
        assert set(by_step.columns) <= set(acc.Tags()["tensors"])
        for tag in by_step.columns:  # accuracy/val: NaN in both (a regression)
            steps = [e.step for e in acc.Tensors(tag)]
            assert steps == (evaluated if tag.endswith("/val") else list(range(1, 65))), tag
            np.testing.assert_array_equal(event_scalars(acc, tag),
                                          by_step.loc[steps, tag].to_numpy(np.float32), tag)
        np.testing.assert_allclose(event_scalars(acc, "final/loss"), [summary["final_loss"]],
                                   rtol=1e-6)

    result = gradexp("gradexp.summarize", str(sweep), cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "skipped" not in result.stdout
    runs = pd.read_csv(sweep / "runs.csv", dtype=str, keep_default_na=False)
    assert sorted(runs["run"]) == ["fit_clipped", "fit_unclipped", "gradexp_run"]
    assert set(runs["status"]) == {"completed"}
    tidy = pd.read_csv(sweep / "summary.csv", dtype={"clip": str}, keep_default_na=False,
                       na_values=[""])
    final = tidy[tidy["metric"] == "final_loss"].set_index("group")
    fit_clipped = next(g for g in final.index if "clip=0.1" in g and "optimizer=sgd" in g
                       and "trainer.loss_reduction=mean" in g)
    assert final.at[fit_clipped, "n_paired"] == 1  # against the unclipped fit run, seed 0
    assert final.at[fit_clipped, "losses"] == 1  # clipping dy at 0.1 slowed it down
    assert "clip=null" in final.at[fit_clipped, "baseline"]
    assert final["runs"].sum() == 3 and len(final) == 3
    lines = result.stdout.split("\n\n")[0].splitlines()  # the group table
    header = next(line for line in lines if line.lstrip().startswith("clip"))
    assert "Δ final_loss" in header
    rows = [line for line in lines if line.split()[:1] in (["0.1"], ["null"])]
    assert len(rows) == 3  # the two fit groups and the gradexp run's
    assert any("0/1" in row for row in rows)  # the clipped fit run lost its pair
    assert any("no pair" in row for row in rows)  # the gradexp run has no unclipped partner


# --------------------------------------------------------------------------- divergence
def test_a_diverging_fit_is_recorded_as_diverged_and_stops_there(tmp_path):
    """A huge learning rate: the loss explodes at step 2; fit stops there (not a crash), the
    run is `diverged` at step 2, its final loss the one step before."""
    model, history = fit_run(tmp_path, None, lr=1e3, epochs=3)
    summary = summary_of(tmp_path)
    table = read_metrics(tmp_path / rundir.METRICS)
    assert summary["status"] == rundir.DIVERGED and summary["diverged"] is True
    assert summary["diverged_step"] == table["step"].iloc[-1] == summary["steps"] == 2
    assert summary["final_loss"] == pytest.approx(table["loss/train"].iloc[0])
    assert not np.isfinite(table["loss/train"].iloc[1]) or (
        table["loss/train"].iloc[1] > 1000 * table["loss/train"].iloc[0])
    assert len(history.history["loss"]) == 1  # fit stopped in its first epoch
    assert "train_step" not in model.__dict__ and model.train_function is None


# --------------------------------------------------------------------- refusals, baseline
def test_what_the_callback_refuses_it_says_in_one_line(tmp_path):
    x, y = regression(32)
    model = two_clip_layers(0.1)
    model.compile(keras.optimizers.SGD(0.01), "mse", steps_per_execution=2)
    with pytest.raises(ConfigError, match="^Telemetry: steps_per_execution=2: the measurements "
                                          "need every step"):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[Telemetry(tmp_path / "a")])
    assert not (tmp_path / "a").exists()  # refused before anything is written
    fit_run(tmp_path / "b", 0.1)
    with pytest.raises(ConfigError, match="holds a completed run already"):
        fit_run(tmp_path / "b", 0.1)
    with pytest.raises(ConfigError, match="log_every=0"):
        Telemetry(tmp_path / "c", log_every=0)


def test_a_model_without_clip_layers_logs_the_global_measurements(tmp_path, caplog):
    x, y = regression(64)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8)(inputs)))
    model.compile(keras.optimizers.Adam(0.01), "mse")
    with caplog.at_level(logging.WARNING, logger="gradexp"):
        model.fit(x, y, batch_size=16, verbose=0, callbacks=[Telemetry(tmp_path)])
    assert "has no ClipGradient layer; logging the loss and the global gradient norm only" in (
        caplog.text)
    table = read_metrics(tmp_path / rundir.METRICS)
    assert list(table.columns) == ["step", *GLOBAL, "loss/val", "accuracy/val"]
    assert table[GLOBAL].notna().all().all() and (table["grad_norm/global"] > 0).all()
    config = summary_of(tmp_path)["config"]
    assert config["layer"]["positions"] == [] and config["optimizer"]["name"] == "adam"


class OwnStep(keras.Model):
    """A train_step of the user's own, as Keras's guide writes one."""

    def train_step(self, data):
        from gradexp._tf import tf

        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(y=y, y_pred=self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        return {"loss": loss}


class NoGradient(keras.Model):
    def train_step(self, data):
        return {}


def test_a_train_step_of_the_users_own_is_measured_as_keras_own_is(tmp_path):
    """The same weights and batches through Keras's train_step and through OwnStep: the same
    rows. A train_step that takes no gradient is refused in one line, the model left as it
    was."""
    fit_run(tmp_path / "keras", 0.1)
    fit_run(tmp_path / "own", 0.1, model_class=OwnStep)
    keras_rows, own_rows = (read_metrics(tmp_path / n / rundir.METRICS) for n in ("keras", "own"))
    assert len(own_rows) == 40 and (own_rows["clip_fraction/dense_2"] > 0).any()
    pd.testing.assert_frame_equal(own_rows, keras_rows, rtol=1e-6)
    model = two_clip_layers(0.1, model_class=NoGradient)
    model.compile(keras.optimizers.SGD(0.01), "mse")
    with pytest.raises(ConfigError, match="^Telemetry: the model's train_step takes no "
                                          "tape.gradient of its loss with respect to "
                                          "model.trainable_weights$"):
        model.fit(*regression(16), batch_size=8, verbose=0,
                  callbacks=[Telemetry(tmp_path / "none")])
    assert "train_step" not in model.__dict__ and model.train_function is None


def test_a_fit_that_raised_leaves_a_run_the_next_telemetry_does_not_trip_over(tmp_path):
    """A fit that raises mid-way (here a callback of the user's) leaves its run `running`, as a
    killed run, and the model's step wrapped (Keras tells no callback of an exception); the next
    fit with Telemetry takes that wrapper off and measures once, and leaves the model clean."""

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise RuntimeError("boom")

    x, y = regression(64)
    model = two_clip_layers(0.1)
    model.compile(keras.optimizers.SGD(0.01), "mse")
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[Telemetry(tmp_path / "a"), Boom()])
    assert summary_of(tmp_path / "a")["status"] == rundir.RUNNING
    assert "train_step" in model.__dict__
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[Telemetry(tmp_path / "b")])
    table = read_metrics(tmp_path / "b" / rundir.METRICS)
    assert table["step"].tolist() == list(range(1, 9)) and table["loss/train"].notna().all()
    assert summary_of(tmp_path / "b")["status"] == rundir.COMPLETED
    assert "train_step" not in model.__dict__ and model.train_function is None


def test_the_record_reads_the_settings_off_the_model_in_gradexps_keys():
    """fit_config.record: bounds ±c as clip=c, asymmetric ones as layer.clip_min/max, a key the
    layers differ on as their list; Keras's clipnorm as clipping=norm; Adam's learning rate as
    float32 spells it; a Loss object's reduction; the user's settings, in config and overrides."""
    from gradexp.training import fit_config

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    x = ClipGradient(-0.1, 0.1, name="clip_a")(keras.layers.Dense(4, name="a")(inputs))
    x = ClipGradient(-0.1, 0.1, scale=2.0, name="clip_b")(keras.layers.Dense(4, name="b")(x))
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(x), name="two")
    model.compile(keras.optimizers.Adam(1e-3, clipnorm=0.5),
                  keras.losses.MeanSquaredError(reduction="sum"))
    clip = fit_config.clipping(model.optimizer)
    assert clip == {"name": "norm", "max_norm": 0.5}
    config, overrides = fit_config.record(model, clip, 100, 3, 1000.0, {"dataset.name": "toy"})
    assert overrides == ["clip=0.1", "layer.scale=[1.0,2.0]", "optimizer=adam",
                         "optimizer.learning_rate=0.001", "clipping=norm",
                         "clipping.max_norm=0.5", "trainer.loss_reduction=sum", "seed=3",
                         "dataset.name=toy"]
    assert config["layer"] == {"clip_min": None, "clip_max": None, "scale": [1.0, 2.0],
                               "grad_scale": 1.0, "max_norm": None, "norm_axis": "batch",
                               "positions": ["a", "b"]}
    assert config["trainer"] == {"steps": 100, "loss_reduction": "sum",
                                 "divergence_factor": 1000.0}
    assert config["dataset"] == {"name": "toy"} and config["model"] == {"name": "two"}
    assert config["optimizer"]["beta_1"] == 0.9 and "clipnorm" not in config["optimizer"]

    keras.utils.set_random_seed(0)
    x = ClipGradient(-0.01, 0.5, name="clip_a")(keras.layers.Dense(4, name="a")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(x))
    model.compile(keras.optimizers.SGD(0.05), "mse")
    config, overrides = fit_config.record(model, fit_config.clipping(model.optimizer), None,
                                          None, 1000.0, {})
    assert overrides == ["clip=null", "layer.clip_min=-0.01", "layer.clip_max=0.5",
                         "optimizer=sgd", "optimizer.learning_rate=0.05",
                         "trainer.loss_reduction=mean"]
    assert config["clipping"] == {"name": "none"} and config["seed"] is None
