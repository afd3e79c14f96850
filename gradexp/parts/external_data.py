"""Data from outside gradexp: a user's loader (dataset=arrays) and a TensorFlow Datasets dataset
prepared on disk (dataset=tfds), read into arrays and checked. gradexp/parts/data.py registers their
loaders, which end in `checked`: bad data are answered in one line (a ConfigError) before
anything trains.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from gradexp._tf import tf
from gradexp.config import ConfigError, import_object, need

XY = tuple[np.ndarray, np.ndarray]  # one split's examples and labels (or targets)
CONTRACT = ("must return ((x_train, y_train), (x_val, y_val)) as NumPy arrays, or (train, val) "
            "as unbatched tf.data.Datasets of (x, y) elements, and a third part of its kind "
            "for a test split")
PARTS = ("training", "validation", "test")
READ_BATCH = 4096  # examples per batch when a tf.data.Dataset is read into arrays


# ------------------------------------------------------------------------- dataset=arrays
def user_splits(d: DictConfig) -> tuple[XY, XY, XY | None]:
    """(training, validation, test or None) as `d.load(**d.kwargs)` returns them (`CONTRACT`),
    datasets read into arrays (`read`); a call that could not take the kwargs, or a return
    value of another form, is a ConfigError."""
    load = import_object("dataset.load", d.load)
    kwargs = OmegaConf.to_container(d.kwargs)
    try:
        inspect.signature(load).bind(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"dataset.kwargs={kwargs}: {d.load} {exc}") from None
    except ValueError:  # no signature to read (a builtin): the call will tell
        pass
    returned = load(**kwargs)
    where = f"dataset.load={d.load}"
    parts = isinstance(returned, (tuple, list)) and len(returned) in (2, 3)
    if parts and all(isinstance(part, tf.data.Dataset) for part in returned):
        splits = [read(part, where, name) for part, name in zip(returned, PARTS, strict=False)]
    elif parts and all(is_pair(part) for part in returned):
        splits = [tuple(part) for part in returned]
    else:
        raise ConfigError(f"{where}: {CONTRACT}; it returned {outline(returned)}")
    return splits[0], splits[1], splits[2] if len(splits) == 3 else None


def is_pair(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 2


def outline(value: Any, depth: int = 2) -> str:
    """A value's form, for an error: (ndarray, (ndarray, ndarray)), dict, ..."""
    if isinstance(value, (tuple, list)) and depth:
        return f"({', '.join(outline(part, depth - 1) for part in value)})"
    return type(value).__name__


def read(dataset: tf.data.Dataset, where: str, part: str) -> XY:
    """An unbatched dataset of (x, y) elements as arrays: x (N, *x's shape), y (N, *y's)."""
    spec = dataset.element_spec
    if not (is_pair(spec) and all(isinstance(s, tf.TensorSpec) for s in spec)):
        raise ConfigError(f"{where}: the {part} elements must be (x, y) pairs of tensors; "
                          f"they are {spec}")
    for name, s in zip("xy", spec, strict=True):
        if not s.shape.is_fully_defined():
            raise ConfigError(f"{where}: the {part} examples' {name} has shape {s.shape}: every "
                              "example must have one shape (a batched dataset? unbatch it)")
    batches = list(dataset.batch(READ_BATCH).as_numpy_iterator())
    if not batches:
        return tuple(np.zeros((0, *s.shape), s.dtype.as_numpy_dtype) for s in spec)
    return tuple(np.concatenate([batch[i] for batch in batches]) for i in range(2))


# --------------------------------------------------------------------------- dataset=tfds
def tfds_splits(d: DictConfig) -> tuple[XY, XY, XY | None, int | None]:
    """(training, validation, test or None, num_classes) of the TFDS dataset `d.name` prepared
    in `d.data_dir`: the features `d.x_key` and `d.y_key` of the splits `d.split_train`,
    `d.split_val` and `d.split_test` (None: no test split), as arrays; num_classes:
    `d.num_classes`, else the y feature's (a ClassLabel), else None (from the labels). Read
    from the files alone: nothing is downloaded or built."""
    import tensorflow_datasets as tfds

    data_dir = tfds_data_dir(d.data_dir)
    try:
        builder = tfds.builder(d.name, data_dir=str(data_dir))
        prepared = builder.is_prepared()
    except ValueError:  # DatasetNotFoundError, or a name TFDS cannot parse
        prepared = False
    if not prepared:
        held = (", ".join(prepared_names(data_dir)) or "no prepared dataset"
                if data_dir.is_dir() else "nothing (no such directory)")
        raise ConfigError(f"dataset.name={d.name}: not prepared in dataset.data_dir={data_dir}, "
                          f"which holds {held}")
    features = builder.info.features
    for key in ("x_key", "y_key"):
        need(d[key] in features, f"dataset.{key}", d[key],
             f"must be one of {d.name}'s features: {', '.join(sorted(features))}")
    splits = [tfds_split(builder, d, key) for key in ("split_train", "split_val")]
    test = tfds_split(builder, d, "split_test") if d.split_test is not None else None
    labels = getattr(features[d.y_key], "num_classes", None) if d.task != "regression" else None
    return *splits, test, d.num_classes or labels


def tfds_data_dir(data_dir: str | None) -> Path:
    """`data_dir`, else TFDS's own ($TFDS_DATA_DIR, else ~/tensorflow_datasets)."""
    default = os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets")
    return Path(data_dir or default).expanduser().resolve()


def prepared_names(data_dir: Path) -> list[str]:
    """The datasets prepared in data_dir, as TFDS names them: `name` for name/<version>/,
    `name/config` for name/config/<version>/ (each version has its dataset_info.json)."""
    infos = [*data_dir.glob("*/*/dataset_info.json"), *data_dir.glob("*/*/*/dataset_info.json")]
    return sorted({info.parent.parent.relative_to(data_dir).as_posix() for info in infos})


def tfds_split(builder, d: DictConfig, key: str) -> XY:
    """The (x, y) arrays of the split `d[key]`."""
    try:
        dataset = builder.as_dataset(split=d[key], shuffle_files=False)
    except ValueError as exc:  # no such split, or a bad slice
        raise ConfigError(f"dataset.{key}={d[key]}: {str(exc).splitlines()[0]}") from None
    pairs = dataset.map(lambda example: (example[d.x_key], example[d.y_key]))
    return read(pairs, f"dataset.name={d.name}", d[key])


# ------------------------------------------------------------------------------- checked
def checked(where: str, train: XY, val: XY, task: str = "auto", num_classes: int | None = None,
            test: XY | None = None) -> tuple:
    """(x_train, y_train, x_val, y_val, num_classes, x_test, y_test) as gradexp trains on them
    (x_test, y_test None without a `test` split): x float32 (N, ...), the same example shape in
    every split; y (N,), a (N, 1) column flattened: int32 class labels in [0, num_classes), or
    float32 regression targets and num_classes None. The task: `task`, or with `auto` the
    labels' (integers are classes, floats targets) unless `num_classes` is given; num_classes
    defaults to the largest label + 1. Anything else is a ConfigError that starts with `where`,
    the key the data came from."""
    splits = {"train": train, "val": val, **({"test": test} if test is not None else {})}
    xs, ys = {}, {}
    for name, (x, y) in splits.items():
        xs[name] = inputs(where, f"x_{name}", x)
        ys[name] = labels(where, f"y_{name}", y, f"x_{name}", len(xs[name]))
    names = dict(zip(splits, PARTS, strict=False))
    for name in list(splits)[1:]:
        if xs[name].shape[1:] != xs["train"].shape[1:]:
            raise ConfigError(f"{where}: training examples have shape {xs['train'].shape[1:]}, "
                              f"{names[name]} examples {xs[name].shape[1:]}; they must have "
                              "one shape")
    kinds = {name: label_kind(where, f"y_{name}", y) for name, y in ys.items()}
    for name in list(splits)[1:]:
        if kinds[name] != kinds["train"]:
            raise ConfigError(f"{where}: y_train holds {kinds['train']}, y_{name} "
                              f"{kinds[name]}; both must be integers (class labels) or both "
                              "floats (regression targets)")
    if task == "regression" or (task == "auto" and kinds["train"] == "floats"
                                and num_classes is None):
        ys = {name: y.astype(np.float32) for name, y in ys.items()}
        num_classes = None
    else:  # the classes are training's and validation's: the test split decides nothing
        test_labels = ys.pop("test", None)
        ys, num_classes = class_labels(where, ys, num_classes)
        if test_labels is not None:
            ys["test"] = test_classes(where, test_labels, num_classes)
    return (xs["train"], ys["train"], xs["val"], ys["val"], num_classes, xs.get("test"),
            ys.get("test"))


def inputs(where: str, name: str, x: Any) -> np.ndarray:
    """x as float32 examples (N, ...), N >= 1."""
    try:
        x = np.asarray(x)
    except ValueError as exc:  # a ragged list
        raise ConfigError(f"{where}: {name} is not an array ({exc})") from None
    if x.ndim < 2 or len(x) == 0:
        raise ConfigError(f"{where}: {name} has shape {x.shape}; it must hold N >= 1 examples "
                          "(N, F), (N, T, F) or (N, H, W, C)")
    if not np.issubdtype(x.dtype, np.number):
        raise ConfigError(f"{where}: {name} has dtype {x.dtype}; inputs must be numbers")
    return x.astype(np.float32)


def labels(where: str, name: str, y: Any, x_name: str, n: int) -> np.ndarray:
    """y as one label per example, (n,) (a column (n, 1) flattened)."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim == 1 and len(y) != n:
        raise ConfigError(f"{where}: {x_name} has {n} examples, {name} {len(y)}; they must "
                          "have as many")
    if y.shape != (n,):
        raise ConfigError(f"{where}: {name} has shape {y.shape}; it must hold one label or "
                          f"target per example, ({n},)")
    return y


def test_classes(where: str, y: np.ndarray, num_classes: int) -> np.ndarray:
    """The test split's labels as int32, each one of the `num_classes` classes."""
    outside = y[(y != np.round(y)) | (y < 0) | (y >= num_classes)]
    if len(outside):
        raise ConfigError(f"{where}: y_test holds {outside[0]}, not one of the {num_classes} "
                          f"classes (0 to {num_classes - 1}) of training and validation")
    return y.astype(np.int32)


def label_kind(where: str, name: str, y: np.ndarray) -> str:
    """'integers' or 'floats'; any other dtype is a ConfigError."""
    if np.issubdtype(y.dtype, np.integer):
        return "integers"
    if np.issubdtype(y.dtype, np.floating):
        return "floats"
    raise ConfigError(f"{where}: {name} has dtype {y.dtype}; labels must be integers (classes) "
                      "or floats (regression targets)")


def class_labels(where: str, ys: dict[str, np.ndarray],
                 num_classes: int | None) -> tuple[dict[str, np.ndarray], int]:
    """Each split's labels (`ys`, by split) as int32 and num_classes (default: the largest
    label + 1)."""
    both = np.concatenate(list(ys.values()))
    fractional = both[both != np.round(both)]
    if len(fractional):
        raise ConfigError(f"{where}: the labels hold {fractional[0]}, not a class (an integer); "
                          "float labels are regression targets under dataset.task=auto with "
                          "dataset.num_classes=null")
    low, high = int(both.min()), int(both.max())
    if low < 0:
        raise ConfigError(f"{where}: the labels hold {low}; class labels must be integers >= 0")
    if num_classes is None:
        if high == 0:
            raise ConfigError(f"{where}: every label is 0; a classification needs two classes "
                              "or more (dataset.num_classes), else set dataset.task=regression")
        num_classes = high + 1
    need(num_classes > high, "dataset.num_classes", num_classes,
         f"must exceed the largest label, {high}")
    return {name: y.astype(np.int32) for name, y in ys.items()}, num_classes
