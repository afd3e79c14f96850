"""A run's TensorBoard records beyond the per-step scalars (gradexp/training/logs.py), read back
with TensorBoard's own loader: the gradient histograms of finite values at their step, a
histogram that cannot be written in one line, and a sweep's HParams experiment."""

from __future__ import annotations

import errno
import os
import time

import numpy as np
import pytest
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gradexp.runs.write_errors import WriteFailed
from gradexp.training import logs

NAMES = ["loss/train", "grad_norm/global"]


def test_histograms_count_the_finite_values_at_their_step(make_cfg, tmp_path):
    """A kernel with a NaN and an infinity among 6 values: its histogram counts the 4 finite
    ones (bucket edges from their min to their max); a bias without any: its 3 values."""
    run = logs.RunLog(tmp_path, NAMES, make_cfg())
    kernel = np.array([[0.0, np.nan, 1.0], [2.0, np.inf, 4.0]], np.float32)
    run.histograms(7, {"gradients/dense/kernel": kernel,
                       "gradients/dense/bias": np.array([1.0, 1.0, 3.0])})
    run.close(7, {})
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    events.Reload()
    assert {"gradients/dense/kernel", "gradients/dense/bias"} <= set(events.Tags()["tensors"])
    (kernel_event,) = events.Tensors("gradients/dense/kernel")
    table = np.frombuffer(kernel_event.tensor_proto.tensor_content, "<f8").reshape(30, 3)
    assert kernel_event.step == 7 and table[:, 2].sum() == 4
    assert (table[0, 0], table[-1, 1]) == (0.0, 4.0)
    (bias_event,) = events.Tensors("gradients/dense/bias")
    bias = np.frombuffer(bias_event.tensor_proto.tensor_content, "<f8").reshape(30, 3)
    assert bias[:, 2].sum() == 3 and (bias[0, 2], bias[-1, 2]) == (2, 1)


def test_a_histogram_that_cannot_be_written_is_one_line(make_cfg, tmp_path, monkeypatch):
    run = logs.RunLog(tmp_path, NAMES, make_cfg())

    def full(step, summary):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(run.events, "summary", full)
    run.histograms(200, {"gradients/dense/kernel": np.ones(4)})
    with pytest.raises(WriteFailed) as failed:
        logs.flush()
    assert str(failed.value) == (f"cannot write the event file in {tmp_path} at step 200: "
                                 "No space left on device")
    run.events.close()
    run._table_file.close()


def test_a_sweeps_hparams_experiment_lists_every_value_and_the_final_metrics(tmp_path):
    """A key with one type keeps its values; one whose values mix numbers and strings (a key
    of a new schema) lists them all as strings; the metrics are the final ones. The sweep's
    directory is made with its parents."""
    from dataclasses import dataclass

    from conftest import hparams_experiment

    @dataclass
    class One:  # two schemas that type `a` differently, neither lets a key be null
        a: int = 1
        b: float = 0.5

    @dataclass
    class Other:
        a: str = "x"
        b: float = 2.0

    configs = [OmegaConf.structured(One), OmegaConf.structured(Other)]
    sweep_dir = tmp_path / "multirun" / "sweep"
    before = time.time()
    logs.write_hparams_config(sweep_dir, configs)
    after = time.time()
    experiment = hparams_experiment(sweep_dir)
    assert experiment.domains == {"a": ["1", "x"], "b": [0.5, 2.0]}
    assert experiment.metrics == ["final/loss", "final/val_loss", "final/val_accuracy"]
    # the file's records as TensorBoard's loader reads them: the version event, then the
    # experiment at step 0, each stamped with the time it was written
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    (path,) = sweep_dir.glob("events.out.tfevents.*")
    first, second = EventFileLoader(str(path)).Load()
    assert first.file_version == "brain.Event:2"
    assert second.step == 0 and second.summary.value[0].tag == "_hparams_/experiment"
    assert all(before <= e.wall_time <= after for e in (first, second))


def test_rows_are_tensorboards_scalars_at_their_steps_each_tag_described_once(tmp_path):
    """Two calls of `rows` (the second with a tag the first had not) and one of `scalars`:
    one event a step, every value at its step as TensorBoard's loader reads it, and a tag's
    first value, only its first, carrying the scalars plugin's metadata (as tf.summary
    writes it)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from conftest import event_scalars, events

    writer = logs.EventWriter(tmp_path)
    writer.rows([1, 2, 3], ["a", "b"], [[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    writer.rows([4, 5], ["a", "c"], [[4.0, 0.5], [5.0, 0.25]])
    writer.scalars(6, {"b": 60.0})
    writer.close()
    (path,) = tmp_path.glob("events.out.tfevents.*")
    written = list(EventFileLoader(str(path)).Load())
    assert written[0].file_version == "brain.Event:2"
    assert [e.step for e in written[1:]] == [1, 2, 3, 4, 5, 6]
    described = [(e.step, v.tag) for e in written[1:] for v in e.summary.value
                 if v.metadata.plugin_data.plugin_name == "scalars"]
    assert described == [(1, "a"), (1, "b"), (4, "c")]
    acc = events(tmp_path)
    for tag, steps, values in [("a", [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]),
                               ("b", [1, 2, 3, 6], [10, 20, 30, 60]),
                               ("c", [4, 5], [0.5, 0.25])]:
        assert [e.step for e in acc.Tensors(tag)] == steps, tag
        assert event_scalars(acc, tag).tolist() == values, tag


def test_a_resumed_table_keeps_its_rows_to_the_checkpoint_or_says_why_it_cannot(tmp_path):
    """keep_rows: the rows of steps 1..last_step, a row cut short by a kill dropped, the file
    rewritten to them; a table of other columns, or missing a step, cannot be resumed into."""
    path, header = tmp_path / "metrics.csv", ["step", "loss/train"]
    path.write_text("step,loss/train\n1,0.5\n2,0.25\n3,0.125\n4\n")
    assert logs.keep_rows(path, header, 0) == [] and path.read_text().endswith("\n4\n")
    assert logs.keep_rows(path, header, 2) == [["1", "0.5"], ["2", "0.25"]]
    assert path.read_text() == "step,loss/train\n1,0.5\n2,0.25\n"
    with pytest.raises(ValueError, match=r"metrics.csv: its columns are not this run's"):
        logs.keep_rows(path, ["step", "loss/val"], 1)
    path.write_text("step,loss/train\n1,0.5\n3,0.125\n")
    with pytest.raises(ValueError, match=r"has 1 of the 2 steps before the checkpoint"):
        logs.keep_rows(path, header, 2)


# float32 values whose bytes and digits are awkward: signs, extremes, a subnormal, NaN, infinities
AWKWARD = np.array([0.0, -0.0, 1.0, -2.5, np.pi, 1e-45, 3.4028235e38, -1.1754944e-38, np.nan,
                    np.inf, -np.inf, 0.1], np.float32)


def test_a_calls_scalar_events_are_the_bytes_their_protos_serialize_to(tmp_path):
    """Each step's event, written from the Summary's bytes with its floats put in, is byte for
    byte the Event built field by field and serialized by protobuf; across the steps where the
    step's varint grows a byte (127 to 128, 16383 to 16384)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    names = [f"tag/{i}" for i in range(len(AWKWARD))]
    steps = np.array([126, 127, 128, 129, 16383, 16384, 2**40])
    rows = np.stack([np.roll(AWKWARD, k) for k in range(len(steps))])
    writer = logs.EventWriter(tmp_path)
    before = time.time()
    writer.rows(steps[:1], names, rows[:1])  # the first: with the scalars plugin's metadata
    writer.rows(steps[1:], names, rows[1:])
    after = time.time()
    writer.close()
    (path,) = tmp_path.glob("events.out.tfevents.*")
    written = list(RawEventFileLoader(str(path)).Load())[2:]  # after the version, the first
    assert len(written) == len(steps) - 1
    for record, step, row in zip(written, steps[1:], rows[1:], strict=True):
        wall_time = Event.FromString(record).wall_time
        assert before <= wall_time <= after
        values = [Summary.Value(tag=n, tensor={"dtype": "DT_FLOAT", "float_val": [x],
                                               "tensor_shape": {}})
                  for n, x in zip(names, row, strict=True)]
        expected = Event(wall_time=wall_time, step=int(step), summary=Summary(value=values))
        assert record == expected.SerializeToString(), step


def test_the_table_writes_each_float32_in_nine_digits_that_read_back_exactly(make_cfg, tmp_path):
    """metrics.csv: a call's rows as `step,value,...` with `%.9g`, the telemetry and validation
    columns blank but in the call's last row; every value read back as the float32 written."""
    names = ["loss/train", "grad_norm/global", "param_norm/w"]
    run_log = logs.RunLog(tmp_path, names, make_cfg(), telemetry=("param_norm/w",))
    rows = np.stack([AWKWARD[:3], AWKWARD[3:6], AWKWARD[6:9], AWKWARD[9:12]])
    run_log.steps(np.arange(1, 5), rows, {"loss/val": 0.25, "accuracy/val": 0.75}, measured=True)
    run_log.close(4, {})
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines == ["step,loss/train,grad_norm/global,param_norm/w,loss/val,accuracy/val",
                     "1,0,-0,,,", "2,-2.5,3.14159274,,,", "3,3.40282347e+38,-1.17549435e-38,,,",
                     "4,inf,-inf,0.100000001,0.25,0.75"]
    read = np.array([[float(x or "nan") for x in line.split(",")] for line in lines[1:]])
    np.testing.assert_array_equal(read[:, 1:3].astype(np.float32), rows[:, :2])


def test_a_resumed_run_reads_its_blank_cells_as_nan(make_cfg, tmp_path):
    """past_values: a column blank at the steps that did not measure it (an evaluation's error
    rate, the telemetry) is NaN there and its float32 value where it was written."""
    names = ["loss/train", "param_norm/w"]
    val_names = ("loss/val", "accuracy/val", "error_rate/val")
    first = logs.RunLog(tmp_path, names, make_cfg(), val_names=val_names,
                        telemetry=("param_norm/w",))
    rows = np.array([[1.0, 7.0], [0.5, 7.5], [0.25, 8.0]], np.float32)
    first.steps(np.arange(1, 4), rows, {"loss/val": 0.5, "accuracy/val": 0.75,
                                        "error_rate/val": 0.1}, measured=True)
    first.close(3, {})
    resumed = logs.RunLog(tmp_path, names, make_cfg(), start_step=3, val_names=val_names,
                          telemetry=("param_norm/w",))
    np.testing.assert_array_equal(resumed.past_values("error_rate/val"),
                                  np.array([np.nan, np.nan, 0.1], np.float32))
    np.testing.assert_array_equal(resumed.past_values("param_norm/w"), [np.nan, np.nan, 8.0])
    resumed.close(3, {})


def test_the_event_files_writer_failing_is_named_in_the_one_line(make_cfg, tmp_path):
    """A TensorFlow error from the event file's writer within a call's writes is said as the
    event file's, not the table's (both are written in one block)."""
    from gradexp._tf import tf

    run = logs.RunLog(tmp_path, NAMES, make_cfg())

    class Full:
        def write(self, record):
            raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")

    run.events.file = Full()
    run.steps(np.arange(1, 3), np.ones((2, 2), np.float32), None, measured=False)
    with pytest.raises(WriteFailed) as failed:
        logs.flush()
    assert str(failed.value) == (f"cannot write the event file in {tmp_path} at step 2: "
                                 "No space left on device")
    run._table_file.close()


def test_the_telemetry_is_written_only_in_a_call_that_measured_it(make_cfg, tmp_path):
    """A call that did not measure the telemetry leaves its columns blank, whatever its rows
    hold there (the step writes NaN)."""
    run = logs.RunLog(tmp_path, ["loss/train", "param_norm/w"], make_cfg(),
                      telemetry=("param_norm/w",))
    rows = np.array([[1.0, 7.0], [0.5, 7.5]], np.float32)
    run.steps(np.arange(1, 3), rows, None, measured=False)
    run.steps(np.arange(3, 5), rows, None, measured=True)
    run.close(4, {})
    assert (tmp_path / "metrics.csv").read_text().splitlines()[1:] == [
        "1,1,,,", "2,0.5,,,", "3,1,,,", "4,0.5,7.5,,"]


def test_a_row_not_as_wide_as_its_names_is_refused(tmp_path):
    """rows: a row with fewer or more values than names, or rows not one a step, is a caller's
    bug, refused, in the first call (which describes the tags) as in the others."""
    writer = logs.EventWriter(tmp_path)
    for row in ([1.0], [1.0, 2.0, 3.0]):
        with pytest.raises(ValueError):
            writer.rows([1], ["a", "b"], [row])
    writer.rows([1], ["a", "b"], [[1.0, 2.0]])
    with pytest.raises(ValueError):
        writer.rows([2], ["a", "b"], [[1.0]])
    with pytest.raises(ValueError):  # and as many rows as steps
        writer.rows([2, 3], ["a", "b"], [[1.0, 2.0]] * 3)
    writer.close()


def test_closing_writes_the_final_metrics_or_says_in_one_line_what_it_could_not(make_cfg,
                                                                                 tmp_path):
    """close: the final figures as `final/<name>` scalars at the last step (None left out);
    a full disk under the table or the event file then, in one line naming it and the step."""
    from conftest import event_scalars, events
    from gradexp._tf import tf

    (tmp_path / "ok").mkdir()
    run = logs.RunLog(tmp_path / "ok", NAMES, make_cfg())
    run.close(3, {"loss": 0.5, "val_loss": None})
    acc = events(tmp_path / "ok")
    assert [t for t in acc.Tags()["tensors"] if t.startswith("final/")] == ["final/loss"]
    assert [e.step for e in acc.Tensors("final/loss")] == [3]
    assert event_scalars(acc, "final/loss").tolist() == [0.5]

    (tmp_path / "table").mkdir()
    run = logs.RunLog(tmp_path / "table", NAMES, make_cfg())
    run._table_file.close()
    run._table_file = open("/dev/full", "w")  # the table's file, on a full device
    run._table_file.write("1,0.5,0.25\n")
    with pytest.raises(WriteFailed) as failed:
        run.close(3, {})
    assert str(failed.value).startswith(f"cannot write metrics.csv in {tmp_path / 'table'} at "
                                        "step 3: No space left on device")

    class Full:
        def write(self, record):
            raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")

    (tmp_path / "events").mkdir()
    run = logs.RunLog(tmp_path / "events", NAMES, make_cfg())
    run.events.file = Full()
    with pytest.raises(WriteFailed) as failed:
        run.close(4, {"loss": 0.5})
    assert str(failed.value) == (f"cannot write the event file in {tmp_path / 'events'} at "
                                 "step 4: No space left on device")
    run._table_file.close()


def test_the_custom_scalars_page_has_a_chart_per_clip_layer_and_per_telemetry_kind():
    """custom_scalars_layout: TensorBoard's Custom Scalars layout, read back from its summary:
    one chart per clip layer (its ‖dy‖ before and after, by a regular expression over its
    tags), the training charts, and the per-layer charts only when the telemetry is logged."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    def layout(names):
        (value,) = logs.custom_scalars_layout(names).value
        assert value.tag == "custom_scalars__config__"
        return [(c.title, [(chart.title, list(chart.multiline.tag)) for chart in c.chart])
                for c in layout_pb2.Layout.FromString(value.tensor.string_val[0]).category]

    names = ["loss/train", "grad_norm/global", "grad_norm/dense_1/pre", "grad_norm/dense_1/post",
             "clip_fraction/dense_1", "grad_norm/out/pre"]
    clip_layers = ("clip layers", [
        ("dense_1: ‖dy‖ before and after the clip", ["^grad_norm/dense_1/(pre|post)$"]),
        ("out: ‖dy‖ before and after the clip", ["^grad_norm/out/(pre|post)$"]),
        ("share of dy clipped", ["^clip_fraction/"])])
    training = ("training", [("loss", ["^loss/"]),
                             ("parameter gradient norm", ["^grad_norm/global"])])
    assert layout(names) == [clip_layers, training]
    assert layout([*names, "update_norm/dense_1/kernel"])[2] == ("per layer", [
        ("‖g‖ per layer, before parameter clipping", ["^param_grad_norm/[^/]+$"]),
        ("‖g‖ per layer, after parameter clipping", ["^param_grad_norm/.+/post$"]),
        ("update ‖Δθ‖ per layer", ["^update_norm/"]), ("weights ‖θ‖ per layer", ["^param_norm/"]),
        ("‖Δθ‖ / ‖θ‖ per layer", ["^update_ratio/"])])
