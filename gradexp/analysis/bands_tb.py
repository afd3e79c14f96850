"""`python -m gradexp.summarize DIR --tensorboard`: each setting's mean over seeds with its 95%
band (analysis.curves.across_seeds, the band of the PNGs) as a TensorBoard run
`summary_tb/<setting>/`, with tags `mean/<metric>`, `lower/<metric>`, `upper/<metric>` at every
step of the runs, and a Custom Scalars layout of margin charts (value with lower and upper: the
only way TensorBoard draws a band) in each of those runs.

Written as write_hparams_config in gradexp.training.logs writes: Event protos framed by
TensorBoard's pure-Python RecordWriter; neither TensorFlow nor tf.summary is imported (the
tensorboard package alone: ~0.3 s).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from pathlib import Path

import pandas as pd

from gradexp.analysis.curves import across_seeds

SUMMARY_TB = "summary_tb"
BAND_TAGS = ("mean", "lower", "upper")
# always, when the runs have them; grad_norm/global/post: after parameter-gradient clipping
TRAINING = ("loss/train", "loss/val", "grad_norm/global", "grad_norm/global/post")
CLIP_LAYER = re.compile(r"^(grad_norm/(?!global/)[^/]+/(pre|post)|clip_fraction/[^/]+)$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


def run_dir_name(label: str) -> str:
    """A setting's label → a directory name (and TensorBoard run name) of the characters
    A-Z a-z 0-9 . _ + - only: between pairs ` ` → `,`; in a pair `=` → `-`, `/` → `.`,
    `,` → `+`, `[` `]` dropped, any other character → `_`.
    `clip=0.1 layer.positions=[rnn_1,dense_1]` → `clip-0.1,layer.positions-rnn_1+dense_1`."""
    pairs = []
    for pair in label.split(" "):
        text = pair.replace("=", "-", 1).replace("/", ".").replace(",", "+")
        pairs.append(_UNSAFE.sub("_", text.replace("[", "").replace("]", "")))
    return ",".join(pairs)


def run_dir_names(labels: list[str]) -> dict[str, str]:
    """Each label's run_dir_name; a name already taken gets `~2`, `~3`, … (`~` is never part
    of a mapped name), so that two settings never share a run."""
    names: dict[str, str] = {}
    for label in labels:
        name, k = run_dir_name(label), 1
        while name in names.values():
            k += 1
            name = f"{run_dir_name(label)}~{k}"
        names[label] = name
    return names


def band_metrics(curves: dict[str, list[pd.DataFrame]]) -> list[str]:
    """The metrics drawn: TRAINING's that some run has, then each clip layer's ‖dy‖ before
    and after its clip and its clip fraction, layer by layer."""
    columns = list(dict.fromkeys(c for tables in curves.values() for t in tables
                                 for c in t.columns))
    layers = sorted((c for c in columns if CLIP_LAYER.match(c)), key=lambda c: (
        c.split("/")[1], 2 if c.startswith("clip_fraction") else c.endswith("/post")))
    return [c for c in TRAINING if c in columns] + layers


def band_layout(metrics: list[str]):
    """The Custom Scalars layout: a margin chart per metric (mean, lower, upper), in two
    categories whose titles differ from a run's own layout (gradexp.training.logs), so that a
    TensorBoard over the whole sweep keeps both."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    def chart(metric: str):
        series = layout_pb2.MarginChartContent.Series(
            value=f"mean/{metric}", lower=f"lower/{metric}", upper=f"upper/{metric}")
        return layout_pb2.Chart(title=metric, margin=layout_pb2.MarginChartContent(
            series=[series]))

    categories = [
        layout_pb2.Category(title=f"mean over seeds, 95% band: {title}",
                            chart=[chart(m) for m in chosen])
        for title, chosen in (("training", [m for m in metrics if m in TRAINING]),
                              ("clip layers", [m for m in metrics if m not in TRAINING]))
        if chosen]
    # what custom_scalar.summary.pb returns, built without it: it imports TensorFlow
    return Summary(value=[Summary.Value(
        tag=metadata.CONFIG_SUMMARY_TAG, metadata=metadata.create_summary_metadata(),
        tensor={"dtype": "DT_STRING", "tensor_shape": {},
                "string_val": [layout_pb2.Layout(category=categories).SerializeToString()]})])


def write_bands(curves: dict[str, list[pd.DataFrame]], out: Path) -> Path:
    """Write `out/summary_tb/`: a run per setting (run_dir_names) and settings.csv (run,
    setting, seeds). Built beside it and swapped in whole: a summary_tb/ of an earlier
    summary is replaced, never appended to, and an interrupted one never looks finished."""
    metrics = band_metrics(curves)
    layout = band_layout(metrics)
    final = out / SUMMARY_TB
    partial = out / f".{SUMMARY_TB}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    names = run_dir_names(list(curves))
    for label, tables in curves.items():
        bands = {m: across_seeds(tables, m) for m in metrics}
        _write_run(partial / names[label], label, len(tables), bands, layout)
    pd.DataFrame({"run": list(names.values()), "setting": list(names),
                  "seeds": [len(t) for t in curves.values()]}).to_csv(
        partial / "settings.csv", index=False)
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)
    return final


def _write_run(run_dir: Path, label: str, seeds: int, bands: dict[str, pd.DataFrame],
               layout) -> None:
    """One setting's event file: the layout at step 0, then an event per step holding every
    metric's mean, lower and upper at that step (a metric without a value there, e.g. loss/val
    between evaluations, is absent from it). Values are float32, as a run's own scalars:
    TensorBoard's fast loader serves no float64 scalar."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.scalar import metadata as scalar_metadata
    from tensorboard.summary.writer.record_writer import RecordWriter

    columns = {f"{kind}/{metric}": band[kind] for metric, band in bands.items()
               for kind in BAND_TAGS if not band.empty}  # none: every run of the group failed
    wide = pd.concat(columns, axis=1).sort_index() if columns else pd.DataFrame()
    described: set[str] = set()

    def value(tag: str, x: float):
        metadata = None
        if tag not in described:  # a tag's first value says it is a scalar, and what it is
            described.add(tag)
            kind, metric = tag.split("/", 1)
            metadata = scalar_metadata.create_summary_metadata(
                display_name=None, description=f"{label}: {metric}, {_MEANING[kind]} over "
                                               f"{seeds} seed{'s' * (seeds != 1)}")
        return Summary.Value(tag=tag, metadata=metadata, tensor={
            "dtype": "DT_FLOAT", "float_val": [x], "tensor_shape": {}})

    run_dir.mkdir(parents=True)
    name = f"events.out.tfevents.{time.time():.0f}.{socket.gethostname()}.{os.getpid()}.v2"
    with open(run_dir / name, "wb") as f:
        records = RecordWriter(f)
        now = time.time()
        records.write(Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
        records.write(Event(wall_time=now, step=0, summary=layout).SerializeToString())
        tags = list(wide.columns)
        for step, row in zip(wide.index.tolist(), wide.to_numpy(float).tolist(), strict=True):
            summary = Summary(value=[value(tag, x) for tag, x in zip(tags, row, strict=True)
                                     if x == x])  # NaN: no value of this metric at this step
            records.write(Event(wall_time=now, step=int(step),
                                summary=summary).SerializeToString())


_MEANING = {"mean": "the mean", "lower": "the lower end of the 95% t-interval of the mean",
            "upper": "the upper end of the 95% t-interval of the mean"}
