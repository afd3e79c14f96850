"""Short real runs composed from the real config; their files read back by TensorBoard's loader."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pandas as pd
import pytest
from tensorboard.plugins.hparams import plugin_data_pb2

from conftest import QUICK, REPO, events, gradexp
from conftest import event_scalars as scalar
from gradexp.analysis.metrics import run_metrics
from gradexp.analysis.runs import read_metrics
from gradexp.train import train

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

LAYERS = ["dense_1", "dense_2", "dense_3"]
TAGS = ["loss/train", "loss/val", "accuracy/val", "grad_norm/global", "learning_rate",
        *[f"grad_norm/{p}/{w}" for p in LAYERS for w in ("pre", "post")],
        *[f"clip_fraction/{p}" for p in LAYERS]]


@pytest.fixture(scope="module")
def clipped_run(tmp_path_factory):
    """`python -m gradexp.train clip=0.1` as a user types it (shortened), in a fresh folder."""
    cwd = tmp_path_factory.mktemp("user")
    result = gradexp("gradexp.train", *QUICK, "clip=0.1", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (cwd / "outputs").glob("*/*")
    return run_dir, result


def test_cli_run_leaves_a_complete_run_directory(clipped_run):
    run_dir, result = clipped_run
    assert {p.name for p in (run_dir / ".hydra").iterdir()} == {
        "config.yaml", "hydra.yaml", "overrides.yaml"}
    assert list(run_dir.glob("events.out.tfevents.*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["diverged"] is False
    assert summary["steps"] == 30 and summary["config"]["clip"] == 0.1
    assert "clip=0.1" in summary["overrides"]
    assert summary["data"] == {"input_shape": [32], "num_classes": 10,  # dataset=synthetic's
                               "train_examples": 4096 - 819, "val_examples": 819}
    # progress lines, then one final line with loss, accuracy, time and directory
    lines = result.stdout.strip().splitlines()
    assert sum(line.startswith("step ") for line in lines) == 3
    assert lines[-1].startswith("completed: final loss") and str(run_dir) in lines[-1]
    assert result.stderr == ""  # no TensorFlow start-up noise


def test_the_run_records_its_code_packages_and_devices(clipped_run):
    """provenance.json: this checkout's commit, its state (the diff beside it when tracked
    files differ from the commit), the versions and packages, the devices of summary.json."""
    run_dir, _ = clipped_run
    record = json.loads((run_dir / "provenance.json").read_text())
    assert {"recorded_at", "host", "code", "python", "platform", "cpu", "environment",
            "versions", "packages", "devices", "resumes"} <= set(record)

    def git(*args):
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              check=True).stdout

    code = record["code"]
    assert code["commit"] == git("rev-parse", "HEAD").strip() and code["error"] is None
    dirty = bool(git("status", "--porcelain", "--untracked-files=no").strip())
    assert code["dirty"] is dirty and (run_dir / "provenance.diff").exists() is dirty
    assert set(record["versions"]) == {"python", "tensorflow", "keras", "hydra", "numpy",
                                       "gradexp"}
    assert record["versions"]["keras"] == record["packages"]["keras"]
    summary = json.loads((run_dir / "summary.json").read_text())
    devices = record["devices"]
    assert devices["description"] == summary["device"] and devices["strategy"] == "none"
    assert devices["replicas"] in (["/device:CPU:0"], ["/device:GPU:0"])
    assert set(devices["replicas"]) <= set(devices["visible"])
    assert record["resumes"] == []


def test_tensorboard_reads_every_tag_and_pre_post_differ_when_clipped(clipped_run):
    run_dir, _ = clipped_run
    acc = events(run_dir)
    tags = set(acc.Tags()["tensors"])
    assert set(TAGS) <= tags
    assert len(scalar(acc, "loss/train")) == 30
    assert [e.step for e in acc.Tensors("loss/val")] == [30]
    assert any(t.startswith("gradients/") for t in acc.Tags()["histograms"] + acc.Tags()["tensors"])
    for p in LAYERS:
        pre, post = scalar(acc, f"grad_norm/{p}/pre"), scalar(acc, f"grad_norm/{p}/post")
        assert np.all(post <= pre + 1e-6)
    assert np.any(scalar(acc, "grad_norm/dense_3/post") < scalar(acc, "grad_norm/dense_3/pre"))
    assert scalar(acc, "clip_fraction/dense_3").max() > 0
    # HParams: the flattened config, as TensorBoard's hparams plugin stores it
    content = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["clip"].string_value == "0.1" and hparams["model.width"].number_value == 16


def test_metrics_table_matches_the_event_files(clipped_run):
    """The two writers agree: every tag is its column, at the same steps, with the same value.
    Both are written from one array, so this checks the writing (tags, columns, steps), not
    the numbers: tests/test_by_hand.py checks those against values computed without gradexp."""
    run_dir, _ = clipped_run
    table = pd.read_csv(run_dir / "metrics.csv")
    acc = events(run_dir)
    assert list(table["step"]) == list(range(1, 31))
    for tag in TAGS:
        column = table[tag].dropna().to_numpy(np.float32)
        np.testing.assert_array_equal(column, scalar(acc, tag).astype(np.float32))


def test_summarize_reads_the_trainers_numbers_to_the_last_digit(clipped_run):
    """The table's nine digits parsed as float64 are off in the ninth digit; as float32 they are
    the run's numbers, and the summary's final loss is summary.json's exactly."""
    run_dir, _ = clipped_run
    table, acc = read_metrics(run_dir / "metrics.csv"), events(run_dir)
    for tag in TAGS:
        np.testing.assert_array_equal(table[tag].dropna().to_numpy(), scalar(acc, tag))
    trainer = json.loads((run_dir / "summary.json").read_text())
    assert run_metrics(table)["final_loss"] == trainer["final_loss"]
    assert run_metrics(table)["val_accuracy"] == trainer["val_accuracy"]



def test_clip_fraction_is_the_share_of_elements_changed(clipped_run):
    """From a clip layer's statistics [Σg², Σdx², changed, count]: ‖dy‖ before and after and the
    fraction changed / count (by hand: 3 of 12); and in a real clipped run every logged fraction
    is a share, in [0, 1], with some elements clipped at ±0.1."""
    from gradexp.training.step import layer_metrics

    m = {k: float(v) for k, v in layer_metrics("d", [4.0, 1.0, 3.0, 12.0]).items()}
    assert m == {"grad_norm/d/pre": 2.0, "grad_norm/d/post": 1.0, "clip_fraction/d": 0.25}
    table = read_metrics(clipped_run[0] / "metrics.csv")
    fractions = table[[f"clip_fraction/{p}" for p in LAYERS]].to_numpy()
    assert ((fractions >= 0) & (fractions <= 1)).all() and fractions.max() > 0


def test_clip_fraction_of_one_element_and_of_none():
    """layer_metrics by hand at the edges of its denominator max(count, 1): one element,
    clipped, is a fraction of 1; no element at all (an empty batch) is 0, not NaN."""
    from gradexp.training.step import layer_metrics

    assert float(layer_metrics("d", [4.0, 1.0, 1.0, 1.0])["clip_fraction/d"]) == 1.0
    assert float(layer_metrics("d", [0.0, 0.0, 0.0, 0.0])["clip_fraction/d"]) == 0.0


def test_unclipped_run_has_equal_pre_and_post_norms(make_cfg, tmp_path):
    cfg = make_cfg(*QUICK, "trainer.steps=20", "trainer.eval_every=10")
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["val_accuracy"] is not None
    table = pd.read_csv(tmp_path / "metrics.csv")
    for p in LAYERS:
        np.testing.assert_array_equal(table[f"grad_norm/{p}/pre"], table[f"grad_norm/{p}/post"])
        assert (table[f"clip_fraction/{p}"] == 0).all()
    assert table["accuracy/val"].notna().sum() == 2
    assert table["loss/train"].iloc[-1] < table["loss/train"].iloc[0]  # it learns


def test_success_criterion_of_pascanu_et_al():
    """measures.success_step / succeeded against hand-computed cases: the first evaluation
    whose error rate is below the bound, judged again at the final evaluation."""
    from gradexp.runs.measures import succeeded, success_step

    nan = float("nan")
    steps = [1, 2, 3, 4, 5, 6]
    rates = [nan, 0.5, nan, 0.009, nan, 0.02]  # below 0.01 at step 4, not at the end
    assert success_step(steps, rates, 0.01) == 4
    assert succeeded(rates, 0.01, diverged_=False) is False  # judged at the final evaluation
    assert succeeded(rates[:5], 0.01, diverged_=False) is True
    assert succeeded(rates[:5], 0.01, diverged_=True) is False  # a diverged run failed
    assert succeeded([0.01], 0.01, diverged_=False) is False  # fewer than 1%: strictly below
    assert np.isnan(success_step(steps, [nan] * 6, 0.01))
    assert succeeded([nan, nan], 0.01, diverged_=False) is False  # never evaluated


def test_the_error_rate_counts_sequences_whose_squared_error_exceeds_the_threshold(
        make_cfg, tmp_path):
    """error_rate/val is #{(ŷ − y)² > 0.04} / n over the held-out set (checked against a count
    from a model's own predictions); it fills the table at each evaluation, and success and
    its step reach summary.json."""
    from gradexp._tf import tf
    from gradexp.parts import data
    from gradexp.training.step import make_step

    overrides = ["model=rnn", "model.units=8", "dataset=adding", "dataset.length=10",
                 "dataset.variant=pascanu2013", "dataset.stream=true", "dataset.num_examples=300",
                 "dataset.error_threshold=0.04", "trainer.steps=40", "trainer.eval_every=20",
                 "trainer.log_every=20", "trainer.histogram_every=0", "trainer.batch_size=20"]
    cfg = make_cfg(*overrides)
    summary = train(cfg, tmp_path)
    table = pd.read_csv(tmp_path / "metrics.csv")
    rates = table["error_rate/val"].dropna()
    assert list(rates.index + 1) == [20, 40] and ((rates > 0) & (rates <= 1)).all()
    assert summary["success"] is False and summary["success_step"] is None  # 40 steps: no
    # the same count from the model's predictions
    arrays = data.load(cfg.dataset)
    compiled = make_step(cfg, arrays)
    val = data.validation_set(arrays)
    predicted = compiled.model.predict(arrays.x_val, verbose=0)[:, 0]
    expected = np.mean((predicted - arrays.y_val) ** 2 > 0.04)
    values = [tf.convert_to_tensor(v) for v in compiled.model.variables]
    assert float(compiled.evaluate(values, *val)["error_rate/val"]) == pytest.approx(expected,
                                                                                   abs=1e-6)
    assert 0.0 < expected < 1.0
    # an error is a squared error above the threshold, not at it: the zero model's outputs are
    # 0, its squared errors y², and a threshold equal to one of them leaves that example out
    squared = np.asarray(arrays.y_val, np.float32) ** 2
    at = squared[squared > 0][0]
    boundary = make_step(make_cfg(*overrides, f"dataset.error_threshold={float(at)!r}"), arrays)
    measured = boundary.evaluate([tf.zeros_like(v) for v in values], *val)
    rate = measured["error_rate/val"].numpy()  # a float32 share
    assert rate == np.float32(np.mean(squared > at)) != np.float32(np.mean(squared >= at))
    assert np.isnan(float(measured["accuracy/val"]))  # a regression has no accuracy


def test_the_step_refuses_a_model_that_cannot_take_the_datasets_examples(make_cfg):
    """make_step checks the arrays' actual shape before it builds anything: an RNN given
    the teacher's vectors (32,) is refused with the message the config check would give."""
    from gradexp import config
    from gradexp.parts import data
    from gradexp.training.step import make_step

    cfg = make_cfg("model=rnn", "dataset=teacher", "dataset.num_examples=160")
    arrays = data.load(cfg.dataset)
    expected = ("model=rnn: needs sequence inputs (T, F) or images (H, W, C), read row by "
                "row; dataset=teacher gives vectors (32,)")
    with pytest.raises(config.ConfigError) as refused:
        make_step(cfg, arrays)
    assert str(refused.value) == expected


@pytest.mark.parametrize("jit", [True, False])
def test_the_step_is_xla_compiled_as_trainer_jit_compile_says(make_cfg, tmp_path, jit):
    """trainer.jit_compile=true (the default): the engine's call runs its loop of steps as one
    XLA program (TensorFlow marks the call _XlaMustCompile=true); false: a TensorFlow graph
    (the mark false). The numbers of the two agree to float32 rounding: only the program
    tells."""
    from conftest import started
    from gradexp._tf import tf

    cfg = make_cfg("model.width=8", f"trainer.jit_compile={str(jit).lower()}")
    _, engine = started(cfg, tmp_path, 1)
    traced = engine.train_steps.get_concrete_function(tf.constant(0, tf.int64), tf.constant(1),
                                                      tf.constant([True]))
    graph = traced.graph.as_graph_def()
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    marks = [n.attr["_XlaMustCompile"].b for n in nodes if "_XlaMustCompile" in n.attr]
    assert marks and set(marks) == {jit}


def test_the_pure_step_is_the_engines_compiled_step(make_cfg, tmp_path):
    """`Step.train` on a run's state as values, two steps running in a plain tf.function, gives
    the rows of the engine's compiled call and the state it writes into the run's variables,
    which it does not touch itself."""
    from conftest import first_call, started
    from gradexp._tf import tf
    from gradexp.parts import data
    from gradexp.training.engine import own_variables
    from gradexp.training.step import State

    cfg = make_cfg("model.width=8", "clip=0.1", "clipping=zclip", "clipping.warmup_steps=1")
    run, engine = started(cfg, tmp_path, 2)
    variables = own_variables(run)
    start = [v.numpy().copy() for v in variables]
    counts = (len(run.step.model.variables), len(run.step.variables))
    batches = data.training_batches(run.arrays, cfg.trainer.batch_size, cfg.seed)

    @tf.function
    def pure(values, x, y, measure):
        state, row, _ = run.step.train(State(values[:counts[0]], values[counts[0]:counts[1]],
                                             values[counts[1]:]), x, y, measure)
        return [*state.model, *state.optimizer, *state.carry], row

    values, rows, batch = [tf.constant(v) for v in start], [], iter(batches)
    for measure in (False, True):
        values, row = pure(values, *next(batch), measure)
        rows.append(row.numpy())
    for v, s in zip(variables, start, strict=True):
        np.testing.assert_array_equal(v.numpy(), s)
    expected, _ = first_call(run, engine, 2)
    assert not np.allclose(start[0], variables[0].numpy())  # the compiled call trained
    for i, name in enumerate(run.step.names):
        np.testing.assert_allclose(np.array(rows)[:, i], expected[name], rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    for v, value in zip(variables, values, strict=True):
        np.testing.assert_allclose(value, v.numpy(), rtol=1e-5, atol=1e-7)
    telemetry = [run.step.names.index(name) for name in run.step.telemetry]
    assert telemetry and np.isnan(rows[0][telemetry]).all()  # measured only when asked
    assert np.isfinite(rows[1][telemetry]).all()


def evaluated_in_batches_of_300(make_cfg, monkeypatch, *overrides):
    """Step.evaluate of a seeded model over the validation set in batches of 300, the last one
    shorter; (its figures, the model's outputs on the whole set in float64, the targets)."""
    from gradexp._tf import keras, tf
    from gradexp.parts import data
    from gradexp.training import step as step_module
    from gradexp.training.step import make_step

    monkeypatch.setattr(step_module, "VAL_BATCH", 300)
    keras.utils.set_random_seed(0)  # the weights, whatever ran before
    cfg = make_cfg(*overrides)
    arrays = data.load(cfg.dataset)
    step = make_step(cfg, arrays)
    x_val, y_val = data.validation_set(arrays)
    assert len(x_val) % 300 and len(x_val) > 600  # batches of 300 and a shorter last one
    measured = step.evaluate([tf.convert_to_tensor(v) for v in step.model.variables],
                             x_val, y_val)
    outputs = np.asarray(step.model(x_val, training=False), dtype=np.float64)
    return {k: float(v) for k, v in measured.items()}, outputs, np.asarray(y_val)


def test_the_evaluation_is_the_models_mean_loss_and_accuracy_by_hand(make_cfg, monkeypatch):
    """The evaluation's mean cross-entropy and the share of examples whose largest logit is
    their class, as NumPy computes them from the model's outputs on the whole set."""
    measured, logits, y = evaluated_in_batches_of_300(make_cfg, monkeypatch, "model.width=8")
    shifted = logits - logits.max(axis=1, keepdims=True)
    cross_entropy = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(len(y)), y]
    assert measured["loss/val"] == pytest.approx(cross_entropy.mean(), rel=1e-5)
    assert measured["accuracy/val"] == pytest.approx(np.mean(logits.argmax(1) == y), abs=1e-7)


def test_the_evaluations_error_rate_counts_every_batch_by_hand(make_cfg, monkeypatch):
    """A regression dataset with dataset.error_threshold: the evaluation's mean squared error
    and its error rate #{squared error > threshold} / n are NumPy's on the model's outputs."""
    measured, outputs, y = evaluated_in_batches_of_300(
        make_cfg, monkeypatch, "model=rnn", "model.units=4", "dataset=adding",
        "dataset.length=10", "+dataset.error_threshold=0.04")
    squared = (outputs[:, 0] - y) ** 2
    errors = np.mean(squared > 0.04)
    assert errors > 0  # a count the batches add to
    assert measured["loss/val"] == pytest.approx(squared.mean(), rel=1e-5)
    assert measured["error_rate/val"] == pytest.approx(errors, abs=1e-7)


def test_gradient_histograms_are_tensorboards_own_buckets():
    """gradexp.training.logs.histogram_pb counts with np.bincount what TensorBoard's histogram_pb
    counts with a one-hot matrix: the same proto, byte for byte, special cases included."""
    from tensorboard.plugins.histogram import summary_v2 as histogram

    from gradexp.training.logs import histogram_pb

    rng = np.random.default_rng(0)
    for data in (rng.normal(size=(64, 32)).astype(np.float32), rng.normal(size=7),
                 np.array([0.0, 1e-30, 5.0]), np.array([2.0, 2.0, 2.0]), np.array([])):
        assert (histogram_pb("g", data).SerializeToString()
                == histogram.histogram_pb("g", data).SerializeToString())


def test_positions_listed_then_a_run_in_the_same_process_trains(tmp_path, monkeypatch):
    """`--positions` is one call's flag: a later call of the entry point in the same process
    (a test, a notebook, the docs' examples) trains instead of listing the positions again."""
    from conftest import in_this_process

    monkeypatch.chdir(tmp_path)
    in_this_process(monkeypatch, "--positions")
    assert not (tmp_path / "outputs").exists()  # listed: nothing written
    in_this_process(monkeypatch, *QUICK, "trainer.jit_compile=false", "hydra.run.dir=run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 30


def test_a_single_runs_late_bad_input_is_exit_2_and_a_bug_a_traceback_both_recorded(
        tmp_path, monkeypatch):
    """Through the entry point, in this process: a data loader that cannot be imported is bad
    input found once the run starts (exit status 2; summary.json: failed, with the error); a
    loader that raises is a bug, its exception propagated as it is, and recorded too."""
    from conftest import exit_of, in_this_process

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "broken_loader.py").write_text(
        "def load():\n    raise RuntimeError('the loader has a bug')\n")
    base = [*QUICK, "trainer.jit_compile=false", "dataset=arrays"]
    assert exit_of(monkeypatch, *base, "dataset.load=no_such_module:load", "hydra.run.dir=a") == 2
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith(
        "ConfigError: dataset.load=no_such_module:load: cannot import no_such_module")
    assert summary["overrides"] == [*base, "dataset.load=no_such_module:load"]  # no hydra.*
    assert summary["config"]["dataset"]["load"] == "no_such_module:load"
    with pytest.raises(RuntimeError, match="the loader has a bug"):
        in_this_process(monkeypatch, *base, "dataset.load=broken_loader:load", "hydra.run.dir=b")
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"] == "RuntimeError: the loader has a bug"


def test_a_run_stopped_by_sigterm_exits_143_and_resume_finishes_it_as_if_never_stopped(
        tmp_path, monkeypatch):
    """Through the entry point, in this process: SIGTERM arrives after the call that reached
    step 20 (sent from the run's own bookkeeping, so the moment is exact); the run checkpoints,
    is marked interrupted and the entry point exits 128 + 15; `resume=` continues it from its
    checkpoint, and its table is then an uninterrupted run's, byte for byte."""
    import os
    import signal

    from conftest import exit_of, in_this_process
    from gradexp.training.tracking import Tracker

    monkeypatch.chdir(tmp_path)
    args = [*QUICK, "trainer.jit_compile=false", "trainer.checkpoint_every=10",
            "deterministic=true"]
    in_this_process(monkeypatch, *args, "hydra.run.dir=whole")
    record = Tracker.record

    def record_then_stop(self, *a, **k):
        record(self, *a, **k)
        if self.step == 20:
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the run's stop_requests

    monkeypatch.setattr(Tracker, "record", record_then_stop)
    assert exit_of(monkeypatch, *args, "hydra.run.dir=stopped") == 128 + signal.SIGTERM
    summary = json.loads((tmp_path / "stopped" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == 20
    monkeypatch.setattr(Tracker, "record", record)
    in_this_process(monkeypatch, "resume=stopped")
    summary = json.loads((tmp_path / "stopped" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 30
    assert summary["resumed_from"] == 20  # not trained again from step 0
    assert ((tmp_path / "stopped" / "metrics.csv").read_bytes()
            == (tmp_path / "whole" / "metrics.csv").read_bytes())
