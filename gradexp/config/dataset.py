"""The `dataset` group's schemas (conf/dataset/): each dataset's keys, its checks and the shape
of one example. The loaders are in gradexp/data.py, registered under the same names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from omegaconf import MISSING

from gradexp.config.base import Choice, Registry, at_least, finite, need, one_of


@dataclass
class DatasetConfig(Choice):
    """A dataset; `input_shape()` is the shape of one example."""

    OPTIONS: ClassVar[Registry] = Registry("dataset", "schema", "gradexp/config/dataset.py")

    def input_shape(self) -> tuple[int, ...]:
        raise NotImplementedError


@dataclass
class SyntheticConfig(DatasetConfig):
    """Gaussian clusters: class means ~ N(0, separation² I), x = mean + N(0, I)."""

    name: str = "synthetic"
    num_examples: int = MISSING
    num_features: int = MISSING
    num_classes: int = MISSING
    separation: float = MISSING
    val_fraction: float = MISSING
    seed: int = MISSING  # the data stay the same across run seeds; `seed` varies init and order
    stream: bool = False  # fresh examples every step; all num_examples held out (see data.py)

    def input_shape(self) -> tuple[int, ...]:
        return (self.num_features,)

    def check(self) -> None:
        at_least(self, 2, "num_examples", "num_classes")
        at_least(self, 1, "num_features")
        need(finite(self.separation) and self.separation >= 0, "separation", self.separation,
             "must be a number >= 0")
        check_val_fraction(self.val_fraction)


@dataclass
class DigitsConfig(DatasetConfig):
    """scikit-learn's 8x8 handwritten digits (1797 images), read from inside its wheel."""

    name: str = "digits"
    val_fraction: float = MISSING
    seed: int = MISSING

    def input_shape(self) -> tuple[int, ...]:
        return (8, 8, 1)

    def check(self) -> None:
        check_val_fraction(self.val_fraction)


@dataclass
class AddingConfig(DatasetConfig):
    """The adding problem: `length` steps of (value, marker), target from the two marked values
    (regression). `variant`: le2015 (sum, a marker in each half) or pascanu2013 (mean, markers
    in the first 10% and in 10-50%); values in [0, 1] in both. With
    `error_threshold`, each evaluation logs `error_rate/val`, the share of held-out sequences
    whose squared error exceeds it (Pascanu et al.: 0.04), and a run succeeds when that share
    ends below `success_below` (0.01). Definitions in gradexp/data.py `adding`."""

    name: str = "adding"
    num_examples: int = MISSING
    length: int = MISSING
    val_fraction: float = MISSING
    seed: int = MISSING
    stream: bool = False
    variant: str = "le2015"
    error_threshold: float | None = None
    success_below: float = 0.01
    VARIANTS: ClassVar[tuple[str, ...]] = ("le2015", "pascanu2013")

    def input_shape(self) -> tuple[int, ...]:
        return (self.length, 2)

    def check(self) -> None:
        one_of("variant", self.variant, self.VARIANTS)
        # one marker in each half; pascanu2013: one in the first tenth, one in 10-50%
        at_least(self, 2 if self.variant == "le2015" else 10, "length")
        at_least(self, 2, "num_examples")
        check_val_fraction(self.val_fraction)
        need(self.error_threshold is None or (finite(self.error_threshold)
                                              and self.error_threshold > 0),
             "error_threshold", self.error_threshold, "must be a positive number or null")
        need(finite(self.success_below) and 0 < self.success_below <= 1, "success_below",
             self.success_below, "must be a number in (0, 1]")


@dataclass
class TeacherConfig(DatasetConfig):
    """Regression on a random deep tanh network's output, for deep MLPs (gradexp/data.py
    `teacher`): `depth` layers of `width`, weights N(0, gain²/fan_in), targets standardised."""

    name: str = "teacher"
    num_examples: int = MISSING
    num_features: int = MISSING
    depth: int = MISSING
    width: int = MISSING
    gain: float = MISSING
    noise: float = MISSING
    val_fraction: float = MISSING
    seed: int = MISSING
    stream: bool = False

    def input_shape(self) -> tuple[int, ...]:
        return (self.num_features,)

    def check(self) -> None:
        at_least(self, 2, "num_examples")
        at_least(self, 1, "num_features", "depth", "width")
        need(finite(self.gain) and self.gain > 0, "gain", self.gain, "must be a positive number")
        need(finite(self.noise) and self.noise >= 0, "noise", self.noise, "must be a number >= 0")
        check_val_fraction(self.val_fraction)


@dataclass
class KerasImagesConfig(DatasetConfig):
    """An image set of keras.datasets: its training and test files pooled, then split by
    `val_fraction` like every dataset. The files are read from `cache_dir` (null: Keras's own,
    $KERAS_HOME/datasets or ~/.keras/datasets) and downloaded there when missing."""

    name: str = MISSING
    cache_dir: str | None = MISSING
    num_examples: int | None = MISSING  # null: all; else a random subset (by `seed`) of this many
    val_fraction: float = MISSING
    seed: int = MISSING
    SHAPE: ClassVar[tuple[int, ...]] = ()

    def input_shape(self) -> tuple[int, ...]:
        return self.SHAPE

    def check(self) -> None:
        need(self.num_examples is None or self.num_examples >= 2, "num_examples",
             self.num_examples, "must be an integer >= 2, or null (all)")
        check_val_fraction(self.val_fraction)


@dataclass
class MNISTConfig(KerasImagesConfig):
    """LeCun et al.'s handwritten digits: 70 000 28×28 grey images, 10 classes."""

    name: str = "mnist"
    SHAPE: ClassVar[tuple[int, ...]] = (28, 28, 1)


@dataclass
class FashionMNISTConfig(KerasImagesConfig):
    """Zalando's Fashion-MNIST: 70 000 28×28 grey images of clothes, 10 classes."""

    name: str = "fashion_mnist"
    SHAPE: ClassVar[tuple[int, ...]] = (28, 28, 1)


@dataclass
class CIFAR10Config(KerasImagesConfig):
    """Krizhevsky's CIFAR-10: 60 000 32×32 colour images, 10 classes."""

    name: str = "cifar10"
    SHAPE: ClassVar[tuple[int, ...]] = (32, 32, 3)


def check_val_fraction(value: float) -> None:
    need(0 < value < 1, "val_fraction", value, "must be between 0 and 1 (exclusive)")
