"""A run's measurements in its directory:

- TensorBoard event files: every step's measurements under grouped tags (`loss/train`,
  `grad_norm/global`, `grad_norm/<position>/pre` and `/post`, `clip_fraction/<position>`,
  `learning_rate`), validation metrics, gradient histograms, and the run's HParams (the flattened
  config) with its final metrics (`final/...`).
- `metrics.csv`: one row per step, the same names as columns (validation columns filled at the
  steps where the model was evaluated, the per-layer telemetry's at the steps that measured it).
"""

from __future__ import annotations

import csv
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, ListConfig, OmegaConf
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.scalar import metadata as scalar_metadata

from gradexp.runs.rundir import METRICS
from gradexp.runs.write_errors import writing

VAL_COLUMNS = ("loss/val", "accuracy/val")
SCALAR = scalar_metadata.create_summary_metadata(display_name=None, description=None)


def hparams(cfg: DictConfig) -> dict[str, bool | int | float | str]:
    """The config flattened to `a.b.c: value` for TensorBoard's HParams view. Keys that may be
    null under any choice of their config group (clipping.max_norm is "20.0" under norm too,
    because global_norm lets it be null) are always strings, null "null": TensorBoard hides the
    runs of a column that mixes numbers and strings (tensorboard#2942)."""
    flat: dict[str, Any] = {}
    nullable = _nullable_under_some_choice()
    for key, child in leaves(cfg):
        value = OmegaConf.to_container(child) if isinstance(child, ListConfig) else child._value()
        if child._is_optional() or key in nullable or value is None or isinstance(value, list):
            value = "null" if value is None else str(value)
        flat[key] = value
    return flat


def leaves(node: DictConfig, prefix: str = ""):
    """(`a.b.c`, its node) for every value under `node` (a list is one value)."""
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            yield from leaves(child, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", child


@cache
def _nullable_under_some_choice() -> frozenset[str]:
    """`group.key` for every key that some choice of a config group's schema lets be null
    (clipping.max_norm: global_norm's; dataset.num_examples: mnist's)."""
    from gradexp.config.hydra_glue import GROUPS

    return frozenset(key for base in GROUPS for _, schema in base.OPTIONS.items()
                     for key, child in leaves(OmegaConf.structured(schema),
                                              f"{base.OPTIONS.group}.")
                     if child._is_optional())


FINAL_METRICS = ("loss", "val_loss", "val_accuracy")


def custom_scalars_layout(names: list[str]):
    """TensorBoard's Custom Scalars page: each clip layer's ‖dy‖ before and after on one chart;
    the loss and global norm; with trainer.layer_norms, one chart per telemetry kind, every
    layer a line."""
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.custom_scalar import summary as custom_scalar

    def chart(title: str, pattern: str):
        return layout_pb2.Chart(
            title=title, multiline=layout_pb2.MultilineChartContent(tag=[pattern]))

    layers = [n.split("/")[1] for n in names if n.startswith("grad_norm/") and n.endswith("/pre")]
    clip_charts = [chart(f"{p}: ‖dy‖ before and after the clip", rf"^grad_norm/{p}/(pre|post)$")
                   for p in layers] + [chart("share of dy clipped", r"^clip_fraction/")]
    training = [chart("loss", r"^loss/"), chart("parameter gradient norm", r"^grad_norm/global")]
    per_layer = [chart(title, pattern) for title, pattern in (
        ("‖g‖ per layer, before parameter clipping", r"^param_grad_norm/[^/]+$"),
        ("‖g‖ per layer, after parameter clipping", r"^param_grad_norm/.+/post$"),
        ("update ‖Δθ‖ per layer", r"^update_norm/"), ("weights ‖θ‖ per layer", r"^param_norm/"),
        ("‖Δθ‖ / ‖θ‖ per layer", r"^update_ratio/"))]
    categories = [layout_pb2.Category(title="clip layers", chart=clip_charts),
                  layout_pb2.Category(title="training", chart=training)]
    if any(n.startswith("update_norm/") for n in names):
        categories.append(layout_pb2.Category(title="per layer", chart=per_layer))
    return custom_scalar.pb(layout_pb2.Layout(category=categories))


def write_hparams_config(sweep_dir: Path, configs: list[DictConfig]) -> None:
    """The HParams experiment of a sweep: every flattened config key (with the values the sweep
    takes) and the final metrics, in an event file at the sweep's root, written with
    TensorBoard's record framing and `summary_v2`, pure Python: the launching process of a
    sweep loads no TensorFlow (TensorBoard's EventFileWriter and `hparams.api` would)."""
    from tensorboard.plugins.hparams import summary_v2
    from tensorboard.plugins.hparams.summary_v2 import Discrete, HParam, Metric
    from tensorboard.summary.writer.record_writer import RecordWriter

    values: dict[str, set] = {}
    for cfg in configs:
        for key, value in hparams(cfg).items():
            values.setdefault(key, set()).add(value)
    # a key that still takes strings and numbers (a new schema's key): their strings
    domains = [HParam(key, Discrete(sorted(v if len({type(x) for x in v}) == 1
                                           else {str(x) for x in v})))
               for key, v in values.items()]
    metrics = [Metric(f"final/{name}") for name in FINAL_METRICS]
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir / event_file_name(), "wb") as f:
        records = RecordWriter(f)
        for event in (Event(wall_time=time.time(), file_version="brain.Event:2"),
                      Event(wall_time=time.time(), step=0,
                            summary=summary_v2.hparams_config_pb(domains, metrics))):
            records.write(event.SerializeToString())


def event_file_name() -> str:
    return f"events.out.tfevents.{time.time():.0f}.{socket.gethostname()}.{os.getpid()}.v2"


def keep_rows(path: Path, header: list[str], last_step: int) -> list[list[str]]:
    """Cut a resumed run's table back to the rows of steps 1..last_step (a run killed after its
    last checkpoint wrote rows the resumed run will write again); return them. The header must
    be the one the resumed run writes."""
    if last_step == 0:
        return []
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0] != header:
        raise ValueError(f"{path}: its columns are not this run's; cannot resume into it")
    kept = [r for r in rows[1:] if len(r) == len(header) and int(r[0]) <= last_step]
    if len(kept) != last_step:
        raise ValueError(f"{path}: has {len(kept)} of the {last_step} steps before the "
                         "checkpoint; cannot resume into it")
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([header, *kept])  # as the run wrote it
    os.replace(tmp, path)
    return kept


class EventWriter:
    """One TensorBoard event file, written record by record from Python protos (not through the
    summary APIs, slow for a dozen scalars a step), framed by TensorFlow's C++ TFRecord writer.
    A tag's first value carries the scalars plugin's metadata, as tf.summary writes it."""

    def __init__(self, run_dir: Path):
        from gradexp._tf import tf

        self.file = tf.io.TFRecordWriter(str(run_dir / event_file_name()))
        self.write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.described: set[str] = set()
        self.templates: dict[tuple[str, ...], tuple[bytes, np.ndarray, np.ndarray]] = {}

    def write(self, event) -> None:
        self.file.write(event.SerializeToString())

    def summary(self, step: int, summary) -> None:
        """A Summary proto (TensorBoard's or TensorFlow's: the same message) at `step`."""
        event = Event(step=int(step), wall_time=time.time())
        event.summary.ParseFromString(summary.SerializeToString())
        self.write(event)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.rows([step], list(values), [list(values.values())])

    def rows(self, steps, names: list[str], rows) -> None:
        """Scalars `names` at each of `steps` (`rows[i]` at `steps[i]`), one event per step:
        the bytes Event.SerializeToString gives, a call's steps serialized at once from the
        Summary's bytes with their float32 values put in (`scalars_template`):

            event_i = Event(wall_time, step=steps[i]) · summary field head · S with rows[i]
        """
        start = 0
        new = {n for n in names if n not in self.described}
        if new:  # the first value of a tag says it is a scalar
            self.summary(steps[0], Summary(value=[
                _scalar(n, x, SCALAR if n in new else None)
                for n, x in zip(names, rows[0], strict=True)]))
            self.described |= new
            start = 1
        key = tuple(names)
        if key not in self.templates:
            self.templates[key] = scalars_template(names)
        head, template, at = self.templates[key]
        values = np.asarray(rows, "<f4")[start:]
        summaries = np.tile(template, (len(values), 1))
        summaries[:, at] = values.view(np.uint8)
        stamp = Event(wall_time=time.time())
        for step, summary in zip(steps[start:], summaries, strict=True):
            stamp.step = int(step)
            self.file.write(stamp.SerializeToString() + head + summary.tobytes())

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _scalar(tag: str, x: float, metadata=None):
    return Summary.Value(tag=tag, metadata=metadata, tensor={
        "dtype": "DT_FLOAT", "float_val": [float(x)], "tensor_shape": {}})


def scalars_template(names: list[str]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """A step's scalars `names` as bytes to fill in: the head of an Event's summary field,
    S the Summary's bytes with every value 0, and the positions in S of the values' bytes. A
    value is one float32, 4 bytes always in the same place: the bytes that differ between S
    and S with every value 0x01010101."""
    def serialized(x: float) -> np.ndarray:
        return np.frombuffer(Summary(value=[_scalar(n, x) for n in names]).SerializeToString(),
                             np.uint8)

    zeros = serialized(0.0)
    at = np.flatnonzero(zeros != serialized(float(np.frombuffer(b"\1\1\1\1", "<f4")[0])))
    assert len(at) == 4 * len(names)
    body = zeros.tobytes()
    head = Event(summary=Summary.FromString(body)).SerializeToString()[:-len(body)]
    return head, zeros, at


def histogram_pb(tag: str, data):
    """TensorBoard's `histogram_pb`, the same proto for the same data, its buckets counted with
    np.bincount (not its one-hot n × 30 matrix) and its [30, 3] float64 tensor written as the
    bytes `make_tensor_proto` writes (its generic path costs ~0.3 ms a tensor)."""
    from tensorboard.plugins.histogram import summary_v2 as histogram

    data = np.asarray(data, dtype=float).reshape(-1)
    buckets = histogram.DEFAULT_BUCKET_COUNT
    if data.size == 0 or data.min() == data.max():
        return histogram.histogram_pb(tag, data)  # the special cases: nothing to count
    low, high = data.min(), data.max()
    indices = np.floor((data - low) / ((high - low) / buckets)).astype(int)
    counts = np.bincount(np.minimum(indices, buckets - 1), minlength=buckets)
    edges = np.linspace(low, high, buckets + 1)
    table = np.array([edges[:-1], edges[1:], counts], dtype="<f8").transpose()
    return Summary(value=[Summary.Value(tag=tag, metadata=_histogram_metadata(), tensor={
        "dtype": "DT_DOUBLE", "tensor_shape": {"dim": [{"size": n} for n in table.shape]},
        "tensor_content": table.tobytes()})])


@cache
def _histogram_metadata():
    from tensorboard.plugins.histogram import metadata

    return metadata.create_summary_metadata(display_name=None, description=None)


# One thread writes every run's table and event files, in order, while the loop is in its next
# compiled call (which runs without the GIL). The writes wait for `release()`, which the loop
# calls as it starts that call: begun at once, they took the GIL from the loop.
_WRITER = ThreadPoolExecutor(1, thread_name_prefix="gradexp-writer")
_HELD: list = []  # (work, args) not yet handed to the writer
_LAST: list = [None]  # the writer's last task: a failed write (a full disk) is raised from it


def release() -> None:
    """Hand the writes asked for so far to the writer thread."""
    if _LAST[0] is not None and _LAST[0].done():
        _result()
    if _HELD:
        works = list(_HELD)
        _HELD.clear()
        _LAST[0] = _WRITER.submit(lambda: [work(*args) for work, args in works])


def flush() -> None:
    """Wait until everything asked for is written (raising what a write raised)."""
    release()
    if _LAST[0] is not None:
        _result()


def _result() -> None:
    """The writer's last task's result; a failed write is raised once, and the writes held
    after it (the failed run's) are dropped: the next run in this process starts clean."""
    last, _LAST[0] = _LAST[0], None
    try:
        last.result()
    except BaseException:
        _HELD.clear()
        raise


class RunLog:
    """The writers of one run directory. `names`: the per-step measurements, in row order, the
    last of them `telemetry`, measured only at some steps. Writes happen in the writer thread."""

    def __init__(self, run_dir: Path, names: list[str], cfg: DictConfig, start_step: int = 0,
                 val_names: tuple[str, ...] = VAL_COLUMNS, telemetry: tuple[str, ...] = ()):
        """A new run (start_step 0), or one resumed after `start_step`: its table keeps the
        rows up to that step and grows from there; TensorBoard is told to drop later points."""
        from tensorboard.plugins.hparams import summary_v2 as hp

        self.run_dir, self.names = run_dir, list(names)
        self.val_names, self.telemetry = tuple(val_names), tuple(telemetry)
        self.every_step = len(self.names) - len(self.telemetry)  # columns of every step
        assert tuple(self.names[self.every_step:]) == self.telemetry
        header = ["step", *self.names, *self.val_names]
        self._past_rows = keep_rows(run_dir / METRICS, header, start_step)
        self._table_file = open(run_dir / METRICS, "a" if start_step else "w", newline="")
        # a row's every-step values, then its other columns: blank (literal commas: formatting
        # empty strings cost a third of a row's time) or, in a call's last row, filled
        values = ",".join(["%d"] + ["%.9g"] * self.every_step)
        others = len(self.telemetry) + len(self.val_names)
        self._row_format, self._last_row_format = (values + "," * others + "\n",
                                                   values + ",%s" * others + "\n")
        self.events = EventWriter(run_dir)
        if start_step:  # a SessionLog START: TensorBoard drops an earlier writer's later points
            self.events.write(Event(step=start_step + 1, wall_time=time.time(),
                                    session_log=SessionLog(status=SessionLog.START)))
            return
        self._table_file.write(",".join(header) + "\n")
        self.events.summary(0, hp.hparams_pb(hparams(cfg)))
        self.events.summary(0, custom_scalars_layout(self.names))

    def past_values(self, name: str) -> list[np.float32]:
        """A resumed run's measurement `name` at steps 1..start_step, as the float32 numbers
        the table was written from (so a resumed run's figures are an uninterrupted run's);
        NaN where a column is blank (steps without an evaluation or a measurement)."""
        column = 1 + [*self.names, *self.val_names].index(name)  # column 0: the step
        return [np.float32(row[column] or "nan") for row in self._past_rows]

    def steps(self, steps: np.ndarray, rows: np.ndarray, val: dict[str, float] | None,
              measured: bool = False) -> None:
        """Record steps (`rows[i]` at `steps[i]`); `val` at the last, and with `measured` its
        telemetry (blank in the other rows). `%.9g`: nine significant digits give back every
        float32 exactly (summarize and a resumed run read them so)."""
        if len(rows):
            _HELD.append((self._steps, (steps, rows, val, measured)))

    def _steps(self, steps, rows, val, measured) -> None:
        last, every = int(steps[-1]), rows[:, :self.every_step]
        with writing(METRICS, self.run_dir, last, tensorflow="the event file"):
            self.events.rows(steps, self.names[:self.every_step], every)
            extra = {}
            if measured and self.telemetry:
                extra.update(zip(self.telemetry, rows[-1, self.every_step:].tolist(), strict=True))
            if val is not None:
                extra.update(val)
            if extra:
                self.events.scalars(last, extra)
            # the rows formatted at once, their steps as float64 (exact, as each float32)
            table = np.column_stack([steps, every])
            plain = len(table) - bool(extra)
            text = (self._row_format * plain) % tuple(table[:plain].ravel().tolist())
            if extra:
                text += self._last_row_format % (*table[-1].tolist(), *(
                    f"{extra[c]:.9g}" if c in extra else "" for c in (*self.telemetry,
                                                                      *self.val_names)))
            self._table_file.write(text)
            self._table_file.flush()
            self.events.flush()

    def histograms(self, step: int, tensors: dict[str, Any]) -> None:
        """Histograms of `tensors` (NumPy arrays) at `step`, of their finite values."""
        _HELD.append((self._histograms, (step, tensors)))

    def _histograms(self, step: int, tensors: dict[str, Any]) -> None:
        def finite(t):  # a diverged run's gradients: the histogram of what is finite
            t = np.asarray(t)
            return t[np.isfinite(t)]

        values = [value for name, t in tensors.items()
                  for value in histogram_pb(name, finite(t)).value]
        with writing("the event file", self.run_dir, step):
            self.events.summary(step, Summary(value=values))

    def close(self, step: int, final: dict[str, float]) -> None:
        """Final metrics as `final/<name>` scalars (the HParams view's metric columns)."""
        values = {f"final/{k}": v for k, v in final.items() if v is not None}
        flush()
        with writing(METRICS, self.run_dir, step, tensorflow="the event file"):
            if values:
                self.events.scalars(step, values)
            self.events.close()
            self._table_file.close()
