"""Each schema's `check`, at both sides of every bound: the value just outside is refused with
the one line `key=value: what is allowed` (written out here by hand), the value at or just inside
the bound passes. test_config.py checks one bad value per key through the entry point's compose;
this file pins the bounds themselves, on the schema objects, in this process.

Also the rules of the launchers' and sweepers' settings (gradexp/config/plugins.py), which are
built once when the module is imported, the schemas' registration (in Hydra's ConfigStore,
and of a new option class under its group), and Hydra's errors turned into one line."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from omegaconf import MISSING

from gradexp.config import base, plugins
from gradexp.config.base import ConfigError
from gradexp.config.clipping import (
    AdaGCConfig,
    AGCConfig,
    AutoClipConfig,
    GlobalNormClippingConfig,
    NormClippingConfig,
    ValueClippingConfig,
    ZClipConfig,
)
from gradexp.config.dataset import (
    AddingConfig,
    ArraysConfig,
    CIFAR10Config,
    DigitsConfig,
    FashionMNISTConfig,
    Mnist1DConfig,
    MNISTConfig,
    SyntheticConfig,
    TeacherConfig,
    TFDSConfig,
)
from gradexp.config.layer import LayerConfig
from gradexp.config.model import (
    CNNConfig,
    KerasModelConfig,
    MLPConfig,
    RNNConfig,
    TransformerConfig,
)
from gradexp.config.optimizer import AdamConfig, AdamWConfig, KerasOptimizerConfig, SGDConfig
from gradexp.config.trainer import TrainerConfig

INF, NAN = math.inf, math.nan
POSITIVE = "must be a positive number"
VAL_FRACTION = "must be between 0 and 1 (exclusive)"
ARRAYS = {"load": "my_data:load"}
KERAS_OPTIMIZER = {"class_name": "Lion"}
BAD_ACTIVATION = ("activation=swish: must be one of relu, tanh, sigmoid, gelu, elu, selu, silu, "
                  "softplus, linear")
BAD_INITIALIZER = ("initializer=zeros: must be one of glorot_uniform, glorot_normal, he_uniform, "
                   "he_normal, lecun_uniform, lecun_normal, orthogonal, random_normal, "
                   "random_uniform")

# (schema, its values apart from the defaults, the line `check` raises; None: it passes)
BOUNDS = [
    # clipping
    (ValueClippingConfig, {"max_value": 0.0}, f"max_value=0.0: {POSITIVE}"),
    (ValueClippingConfig, {"max_value": INF}, f"max_value=inf: {POSITIVE}"),
    (ValueClippingConfig, {"max_value": 1e-9}, None),
    (NormClippingConfig, {"max_norm": 0.0}, f"max_norm=0.0: {POSITIVE}"),
    (NormClippingConfig, {"max_norm": 1e-9}, None),
    (GlobalNormClippingConfig, {"max_norm": 0.0},
     "max_norm=0.0: must be a positive number, or null (never clips)"),
    (GlobalNormClippingConfig, {"max_norm": INF},
     "max_norm=inf: must be a positive number, or null (never clips)"),
    (GlobalNormClippingConfig, {"max_norm": 1e-9}, None),
    (GlobalNormClippingConfig, {"max_norm": None}, None),
    (AGCConfig, {"factor": 0.0}, f"factor=0.0: {POSITIVE}"),
    (AGCConfig, {"eps": 0.0}, f"eps=0.0: {POSITIVE}"),
    (AGCConfig, {"factor": 1e-9, "eps": 1e-9}, None),
    (AutoClipConfig, {"percentile": -0.1}, "percentile=-0.1: must be a number in [0, 100]"),
    (AutoClipConfig, {"percentile": 100.1}, "percentile=100.1: must be a number in [0, 100]"),
    (AutoClipConfig, {"percentile": 0.0, "history": 1}, None),
    (AutoClipConfig, {"percentile": 100.0}, None),
    (AutoClipConfig, {"history": 0}, "history=0: must be an integer >= 1"),
    (AdaGCConfig, {"clip_ratio": 0.0}, f"clip_ratio=0.0: {POSITIVE}"),
    (AdaGCConfig, {"beta": 1.0}, "beta=1.0: must be in [0, 1)"),
    (AdaGCConfig, {"beta": -0.1}, "beta=-0.1: must be in [0, 1)"),
    (AdaGCConfig, {"beta": NAN}, "beta=nan: must be in [0, 1)"),
    (AdaGCConfig, {"warmup_steps": -1}, "warmup_steps=-1: must be an integer >= 0"),
    (AdaGCConfig, {"warmup_max_norm": 0.0},
     "warmup_max_norm=0.0: must be a positive number, or null (no warm-up clipping)"),
    (AdaGCConfig, {"warmup_max_norm": INF},
     "warmup_max_norm=inf: must be a positive number, or null (no warm-up clipping)"),
    (AdaGCConfig, {"clip_ratio": 1e-9, "beta": 0.0, "warmup_steps": 0,
                   "warmup_max_norm": 1e-9}, None),
    (AdaGCConfig, {"warmup_max_norm": None}, None),
    (ZClipConfig, {"alpha": 0.0}, "alpha=0.0: must be in (0, 1)"),
    (ZClipConfig, {"alpha": 1.0}, "alpha=1.0: must be in (0, 1)"),
    (ZClipConfig, {"z_threshold": 0.0}, f"z_threshold=0.0: {POSITIVE}"),
    (ZClipConfig, {"warmup_steps": 0}, "warmup_steps=0: must be an integer >= 1"),
    (ZClipConfig, {"mode": "minmax"}, "mode=minmax: must be one of zscore, percentile"),
    (ZClipConfig, {"clip_option": "median"},
     "clip_option=median: must be one of adaptive_scaling, mean"),
    (ZClipConfig, {"clip_factor": 0.0}, "clip_factor=0.0: must be a number in (0, 1]"),
    (ZClipConfig, {"clip_factor": 1.5}, "clip_factor=1.5: must be a number in (0, 1]"),
    (ZClipConfig, {"clip_factor": NAN}, "clip_factor=nan: must be a number in (0, 1]"),
    (ZClipConfig, {"max_grad_norm": 0.0},
     "max_grad_norm=0.0: must be a positive number, or null (no cap)"),
    (ZClipConfig, {"max_grad_norm": INF},
     "max_grad_norm=inf: must be a positive number, or null (no cap)"),
    (ZClipConfig, {"alpha": 1e-9, "z_threshold": 1e-9, "warmup_steps": 1, "clip_factor": 1e-9,
                   "max_grad_norm": 1e-9}, None),
    (ZClipConfig, {"mode": "percentile", "clip_option": "mean"},
     "clip_option=mean: not used by mode=percentile (leave it at adaptive_scaling)"),
    (ZClipConfig, {"mode": "percentile", "clip_factor": 0.5},
     "clip_factor=0.5: not used by mode=percentile (leave it at 1.0)"),
    (ZClipConfig, {"clip_option": "mean", "clip_factor": 0.5},
     "clip_factor=0.5: not used by clip_option=mean (leave it at 1.0)"),
    (ZClipConfig, {"mode": "percentile"}, None),
    (ZClipConfig, {"clip_option": "mean"}, None),
    (ZClipConfig, {"clip_factor": 0.5}, None),
    # datasets
    (SyntheticConfig, {"num_examples": 1}, "num_examples=1: must be an integer >= 2"),
    (SyntheticConfig, {"num_classes": 1}, "num_classes=1: must be an integer >= 2"),
    (SyntheticConfig, {"num_features": 0}, "num_features=0: must be an integer >= 1"),
    (SyntheticConfig, {"separation": -0.1}, "separation=-0.1: must be a number >= 0"),
    (SyntheticConfig, {"separation": INF}, "separation=inf: must be a number >= 0"),
    (SyntheticConfig, {"val_fraction": 0.0}, f"val_fraction=0.0: {VAL_FRACTION}"),
    (SyntheticConfig, {"val_fraction": 1.0}, f"val_fraction=1.0: {VAL_FRACTION}"),
    (SyntheticConfig, {"num_examples": 2, "num_classes": 2, "num_features": 1,
                       "separation": 0.0, "val_fraction": 1e-9}, None),
    (DigitsConfig, {"val_fraction": 1.0}, f"val_fraction=1.0: {VAL_FRACTION}"),
    (DigitsConfig, {"val_fraction": 0.999}, None),
    (Mnist1DConfig, {"val_fraction": 0.0}, f"val_fraction=0.0: {VAL_FRACTION}"),
    (Mnist1DConfig, {"val_fraction": None}, None),
    (Mnist1DConfig, {"val_fraction": 0.5}, None),
    (AddingConfig, {"variant": "le2016"}, "variant=le2016: must be one of le2015, pascanu2013"),
    (AddingConfig, {"length": 1}, "length=1: must be an integer >= 2"),
    (AddingConfig, {"variant": "pascanu2013", "length": 9}, "length=9: must be an integer >= 10"),
    (AddingConfig, {"num_examples": 1}, "num_examples=1: must be an integer >= 2"),
    (AddingConfig, {"val_fraction": 1.0}, f"val_fraction=1.0: {VAL_FRACTION}"),
    (AddingConfig, {"error_threshold": 0.0},
     "error_threshold=0.0: must be a positive number or null"),
    (AddingConfig, {"error_threshold": INF},
     "error_threshold=inf: must be a positive number or null"),
    (AddingConfig, {"success_below": 0.0}, "success_below=0.0: must be a number in (0, 1]"),
    (AddingConfig, {"success_below": 1.5}, "success_below=1.5: must be a number in (0, 1]"),
    (AddingConfig, {"success_below": NAN}, "success_below=nan: must be a number in (0, 1]"),
    (AddingConfig, {"length": 2, "num_examples": 2, "error_threshold": 1e-9,
                    "success_below": 1.0}, None),
    (AddingConfig, {"variant": "pascanu2013", "length": 10, "success_below": 1e-9}, None),
    (TeacherConfig, {"num_examples": 1}, "num_examples=1: must be an integer >= 2"),
    (TeacherConfig, {"num_features": 0}, "num_features=0: must be an integer >= 1"),
    (TeacherConfig, {"depth": 0}, "depth=0: must be an integer >= 1"),
    (TeacherConfig, {"width": 0}, "width=0: must be an integer >= 1"),
    (TeacherConfig, {"gain": 0.0}, f"gain=0.0: {POSITIVE}"),
    (TeacherConfig, {"gain": INF}, f"gain=inf: {POSITIVE}"),
    (TeacherConfig, {"noise": -0.1}, "noise=-0.1: must be a number >= 0"),
    (TeacherConfig, {"noise": NAN}, "noise=nan: must be a number >= 0"),
    (TeacherConfig, {"val_fraction": 0.0}, f"val_fraction=0.0: {VAL_FRACTION}"),
    (TeacherConfig, {"num_examples": 2, "num_features": 1, "depth": 1, "width": 1,
                     "gain": 1e-9, "noise": 0.0}, None),
    (MNISTConfig, {"num_examples": 1}, "num_examples=1: must be an integer >= 2, or null (all)"),
    (MNISTConfig, {"val_fraction": 0.0}, f"val_fraction=0.0: {VAL_FRACTION}"),
    (MNISTConfig, {"num_examples": 2}, None),
    (MNISTConfig, {"num_examples": None}, None),
    (ArraysConfig, {**ARRAYS, "task": "ranking"},
     "task=ranking: must be one of auto, classification, regression"),
    (ArraysConfig, {**ARRAYS, "num_classes": 1},
     "num_classes=1: must be an integer >= 2, or null (from the labels)"),
    (ArraysConfig, {**ARRAYS, "task": "regression", "num_classes": 3},
     "num_classes=3: must be null when dataset.task=regression"),
    (ArraysConfig, {**ARRAYS, "task": "classification", "num_classes": 2}, None),
    (ArraysConfig, {**ARRAYS, "task": "regression"}, None),
    (TFDSConfig, {}, "name=tfds: must be the TFDS name of a dataset prepared in data_dir, "
                     "e.g. dataset.name=mnist"),
    (TFDSConfig, {"name": "mnist", "num_classes": 1},
     "num_classes=1: must be an integer >= 2, or null (from the labels)"),
    (TFDSConfig, {"name": "mnist"}, None),
    # optimizers
    (SGDConfig, {"learning_rate": 0.0}, "learning_rate=0.0: must be a positive number"),
    (SGDConfig, {"learning_rate": INF}, "learning_rate=inf: must be a positive number"),
    (SGDConfig, {"momentum": 1.0}, "momentum=1.0: must be in [0, 1)"),
    (SGDConfig, {"momentum": -0.1}, "momentum=-0.1: must be in [0, 1)"),
    (SGDConfig, {"learning_rate": 1e-9, "momentum": 0.0}, None),
    (AdamConfig, {"learning_rate": 0.0}, "learning_rate=0.0: must be a positive number"),
    (AdamConfig, {"beta_1": 1.0}, "beta_1=1.0: must be in [0, 1)"),
    (AdamConfig, {"beta_1": -0.1}, "beta_1=-0.1: must be in [0, 1)"),
    (AdamConfig, {"beta_2": 1.0}, "beta_2=1.0: must be in [0, 1)"),
    (AdamConfig, {"beta_2": -0.1}, "beta_2=-0.1: must be in [0, 1)"),
    (AdamConfig, {"epsilon": 0.0}, "epsilon=0.0: must be a positive number"),
    (AdamConfig, {"beta_1": 0.0, "beta_2": 0.0, "epsilon": 1e-30}, None),
    (AdamWConfig, {"beta_2": 1.0}, "beta_2=1.0: must be in [0, 1)"),
    (AdamWConfig, {"weight_decay": -0.1}, "weight_decay=-0.1: must be a number >= 0"),
    (AdamWConfig, {"weight_decay": INF}, "weight_decay=inf: must be a number >= 0"),
    (AdamWConfig, {"weight_decay": 0.0}, None),
    (KerasOptimizerConfig, {**KERAS_OPTIMIZER, "learning_rate": 0.0},
     "learning_rate=0.0: must be a positive number"),
    (KerasOptimizerConfig, {"class_name": " "},
     "class_name= : must name a Keras optimizer (e.g. Lion) or a dotted path"),
    (KerasOptimizerConfig, {"class_name": 3},
     "class_name=3: must name a Keras optimizer (e.g. Lion) or a dotted path"),
    (KerasOptimizerConfig, KERAS_OPTIMIZER, None),
    # models
    (MLPConfig, {"depth": 0}, "depth=0: must be an integer >= 1"),
    (MLPConfig, {"width": 0}, "width=0: must be an integer >= 1"),
    (MLPConfig, {"activation": "swish"},
     BAD_ACTIVATION),
    (MLPConfig, {"initializer": "zeros"},
     BAD_INITIALIZER),
    (MLPConfig, {"depth": 1, "width": 1, "activation": "linear"}, None),
    (CNNConfig, {"blocks": 0}, "blocks=0: must be an integer >= 1"),
    (CNNConfig, {"filters": 0}, "filters=0: must be an integer >= 1"),
    (CNNConfig, {"kernel_size": 0}, "kernel_size=0: must be an integer >= 1"),
    (CNNConfig, {"width": 0}, "width=0: must be an integer >= 1"),
    (CNNConfig, {"activation": "swish"},
     BAD_ACTIVATION),
    (CNNConfig, {"initializer": "zeros"},
     BAD_INITIALIZER),
    (CNNConfig, {"blocks": 1, "filters": 1, "kernel_size": 1, "width": 1}, None),
    (RNNConfig, {"cell": "rnn"}, "cell=rnn: must be one of simple, lstm, gru"),
    (RNNConfig, {"units": 0}, "units=0: must be an integer >= 1"),
    (RNNConfig, {"layers": 0}, "layers=0: must be an integer >= 1"),
    (RNNConfig, {"activation": "swish"},
     BAD_ACTIVATION),
    (RNNConfig, {"recurrent_gain": 0.0}, f"recurrent_gain=0.0: {POSITIVE}"),
    (RNNConfig, {"recurrent_gain": INF}, f"recurrent_gain=inf: {POSITIVE}"),
    (RNNConfig, {"init": "orthogonal"}, "init=orthogonal: must be one of keras, pascanu2013"),
    (RNNConfig, {"readout": "first"}, "readout=first: must be one of last, all"),
    (RNNConfig, {"cell": "gru", "units": 1, "layers": 1, "recurrent_gain": 1e-9,
                 "init": "pascanu2013", "readout": "all"}, None),
    (TransformerConfig, {"blocks": 0}, "blocks=0: must be an integer >= 1"),
    (TransformerConfig, {"width": 0}, "width=0: must be an integer >= 1"),
    (TransformerConfig, {"heads": 0}, "heads=0: must be an integer >= 1"),
    (TransformerConfig, {"mlp_width": 0}, "mlp_width=0: must be an integer >= 1"),
    (TransformerConfig, {"width": 30, "heads": 4}, "width=30: must be a multiple of heads (4)"),
    (TransformerConfig, {"norm": "none"}, "norm=none: must be one of pre, post"),
    (TransformerConfig, {"activation": "swish"},
     BAD_ACTIVATION),
    (TransformerConfig, {"blocks": 1, "width": 3, "heads": 3, "mlp_width": 1, "norm": "post"},
     None),
    (KerasModelConfig, {"build": " "},
     "build= : must be a dotted path such as my_package.models:make"),
    (KerasModelConfig, {"build": 3}, "build=3: must be a dotted path such as "
                                     "my_package.models:make"),
    (KerasModelConfig, {"build": "my_models:make"}, None),
    # the clip layers and the trainer
    (LayerConfig, {"clip_min": NAN}, "clip_min=nan: must be a number or null"),
    (LayerConfig, {"clip_max": NAN}, "clip_max=nan: must be a number or null"),
    (LayerConfig, {"clip_min": -INF, "clip_max": INF}, None),
    (LayerConfig, {"max_norm": 0.0}, "max_norm=0.0: must be a positive number or null"),
    (LayerConfig, {"max_norm": INF}, "max_norm=inf: must be a positive number or null"),
    (LayerConfig, {"max_norm": 1e-9, "norm_axis": "example"}, None),
    (LayerConfig, {"norm_axis": "channel"}, "norm_axis=channel: must be one of batch, example"),
    (LayerConfig, {"scale": INF}, "scale=inf: must be a finite number"),
    (LayerConfig, {"grad_scale": NAN},
     "grad_scale=nan: must be a finite number (negative reverses the gradient)"),
    (LayerConfig, {"scale": -1e9, "grad_scale": -1.0}, None),
    (TrainerConfig, {"steps": 0}, "steps=0: must be an integer >= 1"),
    (TrainerConfig, {"batch_size": 0}, "batch_size=0: must be an integer >= 1"),
    (TrainerConfig, {"log_every": 0}, "log_every=0: must be an integer >= 1"),
    (TrainerConfig, {"eval_every": 0}, "eval_every=0: must be an integer >= 1"),
    (TrainerConfig, {"histogram_every": -1},
     "histogram_every=-1: must be an integer >= 0 (0: no histograms)"),
    (TrainerConfig, {"loss_reduction": "max"}, "loss_reduction=max: must be one of sum, mean"),
    (TrainerConfig, {"divergence_factor": 1.0}, "divergence_factor=1.0: must be a number > 1"),
    (TrainerConfig, {"checkpoint_every": -1},
     "checkpoint_every=-1: must be an integer >= 0 (0: only when the run stops)"),
    (TrainerConfig, {"keep_checkpoints": 0}, "keep_checkpoints=0: must be an integer >= 1"),
    (TrainerConfig, {"on_damaged_checkpoint": "skip"},
     "on_damaged_checkpoint=skip: must be one of fail, restart"),
    (TrainerConfig, {"on_divergence": "skip"}, "on_divergence=skip: must be one of stop, continue"),
    (TrainerConfig, {"on_spike": "clip"}, "on_spike=clip: must be one of none, skip"),
    (TrainerConfig, {"spike_z": 0.0}, "spike_z=0.0: must be a number > 0"),
    (TrainerConfig, {"spike_warmup": 0}, "spike_warmup=0: must be an integer >= 1"),
    (TrainerConfig, {"spike_alpha": 0.0}, "spike_alpha=0.0: must be a number in (0, 1)"),
    (TrainerConfig, {"spike_alpha": 1.0}, "spike_alpha=1.0: must be a number in (0, 1)"),
    (TrainerConfig, {"steps": 1, "batch_size": 1, "log_every": 1, "eval_every": 1,
                     "histogram_every": 0, "divergence_factor": 1.001, "checkpoint_every": 0,
                     "keep_checkpoints": 1, "spike_z": 1e-9, "spike_warmup": 1,
                     "spike_alpha": 1e-9}, None),
]


def case_id(case) -> str:
    schema, values, line = case
    return f"{schema.__name__}-{'-'.join(f'{k}={v}' for k, v in values.items())}-" \
           f"{'passes' if line is None else 'refused'}"


@pytest.mark.parametrize(("schema", "values", "line"), BOUNDS, ids=map(case_id, BOUNDS))
def test_each_check_refuses_just_outside_its_bounds_and_takes_the_bound(schema, values, line):
    node = schema(**values)
    if line is None:
        node.check()
        return
    with pytest.raises(ConfigError) as caught:
        node.check()
    assert str(caught.value) == line


@pytest.mark.parametrize(("schema", "shape"), [
    (SyntheticConfig(num_features=7), (7,)), (TeacherConfig(num_features=5), (5,)),
    (DigitsConfig(), (8, 8, 1)), (Mnist1DConfig(), (40, 1)), (AddingConfig(length=9), (9, 2)),
    (MNISTConfig(), (28, 28, 1)), (FashionMNISTConfig(), (28, 28, 1)),
    (CIFAR10Config(), (32, 32, 3)), (ArraysConfig(**ARRAYS), None)])
def test_each_dataset_gives_the_shape_of_one_example(schema, shape):
    assert schema.input_shape() == shape


@pytest.mark.parametrize(("schema", "split"), [
    (SyntheticConfig(), False), (Mnist1DConfig(), False), (Mnist1DConfig(val_fraction=0.2), True),
    (TFDSConfig(name="mnist"), False), (TFDSConfig(name="mnist", split_test="test"), True),
    (ArraysConfig(**ARRAYS), None)])
def test_which_datasets_have_a_test_split(schema, split):
    assert schema.has_test_split() is split


# ------------------------------------------------------------ the launchers' and sweepers' rules
def passes(rule, *values) -> list[bool]:
    return [rule[0](v) for v in values]


def test_the_rule_builders_of_plugin_settings_at_their_bounds():
    count = plugins.count(1, " (jobs at once)")
    assert passes(count, 1, 2, 0, True, 1.0, "1") == [True, True, False, False, False, False]
    assert count[1] == "must be an integer >= 1 (jobs at once)"
    assert passes(plugins.count(0), 0, -1) == [True, False]
    assert plugins.count(0)[1] == "must be an integer >= 0"

    amount = plugins.amount(" (CPUs)")
    assert passes(amount, 0, 0.5, 2, -0.1, INF, NAN, True, "1") == [
        True, True, True, False, False, False, False, False]
    assert amount[1] == "must be a number >= 0 (CPUs)"
    assert plugins.amount()[1] == "must be a number >= 0"

    positive = plugins.positive(" (seconds)")
    assert passes(positive, 1e-9, 3, 0, -1, INF, False) == [True, True, False, False, False, False]
    assert positive[1] == "must be a positive number (seconds)"
    assert plugins.positive()[1] == "must be a positive number"

    optional = plugins.optional(plugins.count(1), "the default")
    assert passes(optional, None, 1, 0) == [True, True, False]
    assert optional[1] == "must be an integer >= 1, or null (the default)"

    text = plugins.text("a job name")
    assert passes(text, "x", " x ", " ", "", 3, None) == [True, True, False, False, False, False]
    assert text[1] == "must be a job name"

    word = plugins.word("a QOS name")
    assert passes(word, "a", "gpu:2", "a,b", "a b", "a,", ",a", "", 3) == [
        True, True, True, False, False, False, False, False]
    assert word[1] == "must be a QOS name"

    one_of = plugins.one_of("r+", None)
    assert passes(one_of, "r+", None, "r") == [True, True, False]
    assert one_of[1] == "must be one of r+, null"


def test_a_memory_size_for_joblib_and_a_ray_address():
    assert [plugins._bytes(v) for v in (None, "1M", "2G", "0.001K", "0K", "0", "1", 1, "abc")] == [
        True, True, True, True, False, False, False, False, False]  # 0.001K: 1 byte
    assert [plugins._ray_address(v) for v in (
        None, "auto", "local", "head:6379", "ray://head:10001", "10.0.0.1:1", "head:65535",
        "head:0", "head:65536", "head", "http://head:6379", "ray://head", "head :1", 6379)] == [
        True, True, True, True, True, True, True, False, False, False, False, False, False, False]


def test_slurm_takes_one_memory_setting_and_a_warning_before_its_time_limit():
    plain = {"mem_gb": None, "mem_per_cpu": None, "mem_per_gpu": None, "signal_delay_s": 59,
             "timeout_min": 1}
    plugins._slurm(plain)
    for one in ({"mem_gb": 4}, {"mem_per_cpu": "4G"}, {"mem_per_gpu": "16G"}):
        plugins._slurm({**plain, **one})
    with pytest.raises(ConfigError) as caught:
        plugins._slurm({**plain, "mem_gb": 4, "mem_per_gpu": "16G"})
    assert str(caught.value) == ("hydra.launcher.mem_gb=4, hydra.launcher.mem_per_gpu=16G: Slurm "
                                 "takes one of them; set the others to null")
    with pytest.raises(ConfigError) as caught:
        plugins._slurm({**plain, "signal_delay_s": 60})
    assert str(caught.value) == ("hydra.launcher.signal_delay_s=60: must be less than the time "
                                 "limit, hydra.launcher.timeout_min=1 minutes (60 s)")


def test_ray_init_takes_ray_inits_arguments_and_counts_of_cpus_and_gpus():
    for init in ({}, {"num_cpus": 0, "num_gpus": 0}, {"num_cpus": None, "num_gpus": 2},
                 {"num_cpus": 3, "log_to_driver": False}):
        plugins._ray({"init": init})
    for init, line in [
            ({"num_gpus": -1}, "hydra.launcher.init.num_gpus=-1: must be an integer >= 0, or "
                               "null (what the machine has)"),
            ({"num_cpus": 1.5}, "hydra.launcher.init.num_cpus=1.5: must be an integer >= 0, or "
                                "null (what the machine has)")]:
        with pytest.raises(ConfigError) as caught:
            plugins._ray({"init": init})
        assert str(caught.value) == line


def test_a_local_ray_runtime_is_counted_as_ray_counts_it(monkeypatch, tmp_path):
    """What `ray.init` would start here: Ray's count of CPUs, and of GPUs at most as many as
    CUDA_VISIBLE_DEVICES lists (four on the node, two visible: two); RAY_OVERRIDE_RESOURCES and
    hydra.launcher.init before them; nothing counted for a cluster it would join instead."""
    from ray._private.accelerators import NvidiaGPUAcceleratorManager
    from ray._private.utils import get_num_cpus

    for variable in ("RAY_ADDRESS", "RAY_OVERRIDE_RESOURCES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(NvidiaGPUAcceleratorManager, "get_current_node_num_accelerators",
                        staticmethod(lambda: 4))  # a node with four GPUs (this one has none)
    counted = (get_num_cpus(), "counted by Ray")
    assert plugins._local_ray_node(None, {}) == {"num_cpus": counted,
                                                 "num_gpus": (4, "counted by Ray")}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert plugins._local_ray_node("local", {}) == {"num_cpus": counted,
                                                    "num_gpus": (2, "counted by Ray")}
    assert plugins._local_ray_node(None, {"num_cpus": 8, "num_gpus": 0}) == {
        "num_cpus": (8, "hydra.launcher.init.num_cpus"),
        "num_gpus": (0, "hydra.launcher.init.num_gpus")}
    monkeypatch.setenv("RAY_OVERRIDE_RESOURCES", '{"CPU": 3, "GPU": 1}')
    assert plugins._local_ray_node(None, {"num_cpus": 8, "num_gpus": 0}) == {
        "num_cpus": (3, "RAY_OVERRIDE_RESOURCES"), "num_gpus": (1, "RAY_OVERRIDE_RESOURCES")}
    monkeypatch.delenv("RAY_OVERRIDE_RESOURCES")

    # a cluster that `ray start` left here (its address in Ray's temporary directory) is joined
    (tmp_path / "ray_current_cluster").write_text("10.0.0.1:6379")
    assert plugins._local_ray_node(None, {"_temp_dir": str(tmp_path)}) is None
    assert plugins._local_ray_node("local", {"_temp_dir": str(tmp_path)}) is not None
    monkeypatch.setenv("RAY_ADDRESS", "local")  # a new runtime, as address=local asks
    assert plugins._local_ray_node(None, {})["num_gpus"] == (2, "counted by Ray")
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    assert plugins._local_ray_node(None, {}) is None
    assert plugins._local_ray_node("auto", {}) is None
    assert plugins._local_ray_node("head:6379", {}) is None


def test_a_runs_directory_is_the_resumed_runs_else_a_new_dated_one_and_a_job_sees_no_hydra():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from conftest import CONF
    from gradexp.config.hydra_glue import task_config

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONF), version_base="1.3"):
            new, resumed = (compose("config", overrides=overrides, return_hydra_config=True)
                            for overrides in ([], ["resume=runs/a"]))
            assert resumed.hydra.run.dir == "runs/a"
            assert new.hydra.run.dir.startswith("outputs/20")
            assert new.hydra.output_subdir == ".hydra"
            assert resumed.hydra.output_subdir.startswith(".hydra/resumed-20")
    finally:
        GlobalHydra.instance().clear()
    assert "hydra" in new and set(task_config(new)) == set(new) - {"hydra"}
    assert task_config(new).trainer == new.trainer


# ------------------------------------------------------------------------------- registration
def test_a_new_option_class_is_registered_under_its_group_and_an_intermediate_one_is_not():
    from gradexp.config.optimizer import OptimizerConfig

    options = OptimizerConfig.OPTIONS
    before = options.items()

    @dataclass
    class Intermediate(OptimizerConfig):  # name MISSING: a base of options, not one
        learning_rate: float = 0.1

    assert options.items() == before
    try:
        @dataclass
        class Mine(Intermediate):
            name: str = "test_mine"

        assert "test_mine" in options and options["test_mine"] is Mine
        assert options.items() == sorted([*before, ("test_mine", Mine)])
    finally:
        options._entries.pop("test_mine", None)
    assert "Intermediate" not in options and "adam" in options and 3 not in options


def test_a_groups_base_class_is_no_option_of_its_group_even_with_a_name():
    from typing import ClassVar

    @dataclass
    class Group(base.Choice):
        OPTIONS: ClassVar[base.Registry] = base.Registry("group", "schema", "here")
        name: str = "the_base"

    @dataclass
    class Option(Group):
        name: str = "option"

    assert Group.OPTIONS.items() == [("option", Option)]


def test_every_schema_is_in_hydras_config_store_under_its_group_and_name():
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from gradexp.config import hydra_glue
    from gradexp.config.root import Config
    from gradexp.config.search import SearchSweeperConfig

    store = ConfigStore.instance()
    saved = dict(store.repo)
    try:
        store.repo.clear()
        hydra_glue.register()
        stored = {name.removesuffix(".yaml"): OmegaConf.get_type(store.load(name).node)
                  for name in store.list("")}
        arrays = store.load("dataset_arrays_schema.yaml").node
    finally:
        store.repo.clear()
        store.repo.update(saved)
    expected = {"base_config": Config, "search_sweeper_schema": SearchSweeperConfig}
    for group in hydra_glue.GROUPS:
        expected |= {f"{group.OPTIONS.group}_{name}_schema": schema
                     for name, schema in group.OPTIONS.items()}
    assert stored == expected
    OmegaConf.set_struct(arrays, True)  # as Hydra composes it: no key a schema lacks
    arrays.kwargs.n = 300  # but a loader's keyword argument, which no schema declares: no `+`
    assert arrays.kwargs == {"n": 300}
    with pytest.raises(AttributeError):
        arrays.n = 300
    assert stored["clipping_zclip_schema"] is ZClipConfig  # spelled out once
    assert stored["dataset_mnist1d_schema"] is Mnist1DConfig


def test_show_need_and_finite():
    assert base.show(None) == "null" and base.show(0.5) == "0.5"
    assert [base.finite(v) for v in (0.0, -1e300, None, INF, -INF, NAN)] == [
        True, True, False, False, False, False]
    base.need(True, "k", 1, "anything")
    with pytest.raises(ConfigError, match=r"^k=null: must be set$"):
        base.need(False, "k", None, "must be set")


def test_hydras_and_omegaconfs_errors_in_one_line():
    from hydra.errors import ConfigCompositionException, OverrideParseException
    from omegaconf.errors import ValidationError

    from gradexp.config.hydra_glue import explain

    def caused(exc, cause):
        exc.__cause__ = cause
        return exc

    bad_bool = ValidationError("Value 'maybe' is not a valid bool")
    assert explain(caused(ConfigCompositionException("Error merging override x.flag=maybe"),
                          bad_bool)) == "x.flag=maybe: Value 'maybe' is not a valid bool"
    assert explain(caused(ConfigCompositionException("Error composing"), bad_bool)) == (
        "config: Value 'maybe' is not a valid bool")  # no key known: the config's
    assert explain(ConfigCompositionException("Could not override 'x'.\n  To append, use +x")) \
        == "Could not override 'x'. To append, use +x"  # Hydra's lines joined
    assert explain(OverrideParseException("clip=[1,", "no viable\n  alternative")) == (
        "clip=[1,: no viable alternative")
    assert explain(caused(RuntimeError("a bug"), bad_bool)) is None  # not Hydra's: a traceback


def test_each_job_of_a_sweep_is_composed_once_and_handed_out_as_its_own_copy():
    """hydra_glue.compose_once on Hydra's own config loader: the second load of a job is the
    first's composition, copied whole (a launcher writes into the config it gets)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import RunMode

    from conftest import CONF
    from gradexp.config.hydra_glue import compose_once

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONF)))
    master = loader.load_configuration("config", overrides=["clip=0.1,0.2"],
                                       run_mode=RunMode.MULTIRUN)
    composed = []
    load = loader.load_sweep_config
    loader.load_sweep_config = lambda *args: composed.append(args[1]) or load(*args)
    compose_once(loader, master)
    first, again = (loader.load_sweep_config(master, ["clip=0.1"]) for _ in range(2))
    other = loader.load_sweep_config(master, ["clip=0.2"])
    assert composed == [["clip=0.1"], ["clip=0.2"]]  # each job's overrides composed once
    assert (first.clip, again.clip, other.clip) == (0.1, 0.1, 0.2)
    first.trainer.steps = 7
    assert again.trainer.steps == 1000  # its own copy, to the last node


def test_slurms_launchers_without_slurms_commands_are_named_as_chosen(monkeypatch):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from conftest import CONF

    monkeypatch.setenv("PATH", os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep)
        if not any(Path(d, c).exists() for c in ("srun", "sbatch"))))
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONF), version_base="1.3"):
            chosen = compose("config", overrides=["hydra/launcher=submitit_slurm"],
                             return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    advice = ("not found on PATH; run the sweep on a machine of the Slurm cluster (a login "
              "node), or choose a launcher for this one: hydra/launcher=gradexp, ray, joblib or "
              "submitit_local")
    with pytest.raises(ConfigError) as caught:
        plugins.check_machine(chosen)
    assert str(caught.value) == f"hydra/launcher=submitit_slurm: srun and sbatch {advice}"
    with open_dict(chosen.hydra.runtime):  # composed outside a run: Slurm's launcher, unnamed
        del chosen.hydra.runtime["choices"]
    with pytest.raises(ConfigError) as caught:
        plugins.check_machine(chosen)
    assert str(caught.value) == f"hydra/launcher=slurm: srun and sbatch {advice}"


def test_an_override_without_a_key_is_refused_whatever_its_prefix():
    from gradexp.config.hydra_glue import check_overrides

    check_overrides(["-m", "clip=0.1", "+a=1", "~b", "X=1", "--cfg=job", "a==1"])
    for bad in ("=1", "+=1", "~=1", "++=1"):
        with pytest.raises(ConfigError) as caught:
            check_overrides(["clip=0.1", bad])
        assert str(caught.value) == f"{bad}: no key before '='; an override is key=value"


def test_a_plugin_setting_is_read_resolved_unless_hydra_fills_it_in_per_job():
    from omegaconf import OmegaConf

    settings = OmegaConf.create({"name": "${hydra.job.name}", "init": {"dir": "${where}"},
                                 "where": "/tmp/ray", "cpus": 3})
    assert plugins._value(settings, "cpus") == 3
    init = plugins._value(settings, "init")
    assert type(init) is dict and init == {"dir": "/tmp/ray"}
    assert plugins._value(settings, "name") == "${hydra.job.name}"  # as written


def test_a_sweepers_settings_are_checked_without_a_launcher_node():
    from omegaconf import OmegaConf

    config = OmegaConf.create({"hydra": {"launcher": None, "sweeper": {
        "_target_": plugins.SEARCH_SWEEPER, "sampler_seed": -1}}})
    with pytest.raises(ConfigError) as caught:
        plugins.check_plugins(config)
    assert str(caught.value) == ("hydra.sweeper.sampler_seed=-1: must be an integer in "
                                 "[0, 2**32 - 1], or null (a new sequence every time)")


@pytest.mark.parametrize(("overrides", "line"), [
    (["clip=0"], "clip=0.0: must be a positive number or null (null: no clipping)"),
    (["clip=1e-9", "seed=0"], None),
    (["seed=4294967295", "dataset.seed=4294967295"], None),  # 2**32 - 1, NumPy's largest
    (["seed=4294967296"], "seed=4294967296: must be an integer in [0, 2**32 - 1]"),
    (["dataset.seed=-1"], "dataset.seed=-1: must be an integer in [0, 2**32 - 1]"),
    (["dataset.seed=4294967296"], "dataset.seed=4294967296: must be an integer in [0, 2**32 - 1]"),
    (["strategy=tpu"], "strategy=tpu: must be one of none, mirrored"),
    (["trainer.on_divergence=continue"], None),  # on one device
    (["strategy=mirrored"], None),
    (["strategy=mirrored", "trainer.on_divergence=continue"],
     "trainer.on_divergence=continue, strategy=mirrored: skipping non-finite updates works on "
     "one device only; use one of them"),
    (["layer.clip_min=0.5", "layer.clip_max=0.5"], None),  # one bound: dy is set to it
    (["layer.clip_min=-0.5", "layer.clip_max=-1"],
     "layer.clip_min=-0.5, layer.clip_max=-1.0: clip_min must not exceed clip_max"),
    (["+extra=1"], "extra: no such key; allowed: model, dataset, optimizer, clipping, layer, "
     "trainer, clip, seed, device, precision, strategy, deterministic, resume"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_the_run_wide_settings_bounds_and_choices(overrides, line):
    from gradexp import api

    if line is None:
        api.compose(*overrides)
        return
    with pytest.raises(ConfigError) as caught:
        api.compose(*overrides)
    assert str(caught.value) == line


def test_what_one_example_is_by_the_rank_of_its_shape():
    from gradexp.config.model import input_kind

    assert [input_kind(s) for s in ((3,), (5, 2), (8, 8, 1), (2, 3, 4, 5))] == [
        "vectors", "sequences", "images", "rank-4 arrays"]


def test_a_key_left_missing_names_what_to_set_it_to_or_that_it_must_be_set():
    """_no_missing: a ??? key's one line gives its schema field's `allowed`, or, a field of a
    user's schema without one, "must be set"."""
    from dataclasses import field

    from omegaconf import MISSING, OmegaConf

    from gradexp.config.root import _no_missing

    @dataclass
    class Settings:
        told: str = field(default=MISSING, metadata={"allowed": "must be set to a name"})
        untold: int = MISSING
        given: int = 1

    node = OmegaConf.structured(Settings)
    with pytest.raises(ConfigError, match=r"^mine\.told=\?\?\?: must be set to a name$"):
        _no_missing(node, "mine")
    node.told = "x"
    with pytest.raises(ConfigError, match=r"^mine\.untold=\?\?\?: must be set$"):
        _no_missing(node, "mine")
    node.untold = 2
    _no_missing(node, "mine")


@dataclass
class _Inner:
    width: int = 1


@dataclass
class _Outer:  # a plain value, then groups: set, left missing, null
    value: int = 0
    inner: _Inner = field(default_factory=_Inner)
    unset: _Inner = MISSING
    nothing: _Inner | None = None


def test_unknown_keys_are_looked_for_in_every_group_after_any_value_but_hydras_own():
    """_unknown_keys: a key no schema declares is refused at any depth, also in a group that
    follows a plain value; `hydra` is allowed at the top only; a group left missing or null is
    not looked into."""
    from omegaconf import OmegaConf

    from gradexp.config.root import _unknown_keys

    def node(top=None, inner=None):
        made = OmegaConf.structured(_Outer)
        OmegaConf.set_struct(made, False)
        OmegaConf.set_struct(made.inner, False)
        made.inner.merge_with(inner or {})
        made.merge_with(top or {})
        return made

    hydras = OmegaConf.structured(_Inner)  # Hydra's own node, keys of its own: not looked into
    OmegaConf.set_struct(hydras, False)
    hydras.run = 1
    _unknown_keys(node({"hydra": hydras}))
    with pytest.raises(ConfigError, match=r"^inner\.extra: no such key; allowed: width$"):
        _unknown_keys(node(inner={"extra": 2}))
    with pytest.raises(ConfigError, match=r"^inner\.hydra: no such key; allowed: width$"):
        _unknown_keys(node(inner={"hydra": 2}))


def test_the_layers_settings_as_composed_bounds_norm_and_positions():
    """clip_bounds: layer.clip_min/max each win over ±clip; clip_spec carries layer.max_norm;
    positions: one name given alone is a list of it, and a user's model (positions known once
    it is built) gets the names as given."""
    from gradexp import api
    from gradexp.config.layer import clip_bounds, clip_spec, positions

    assert clip_bounds(api.compose("clip=0.5", "layer.clip_min=-0.125")) == (-0.125, 0.5)
    assert clip_bounds(api.compose("clip=0.5", "layer.clip_max=0.25")) == (-0.5, 0.25)
    assert clip_bounds(api.compose("layer.clip_max=0.25")) == (None, 0.25)
    spec = clip_spec(api.compose("layer.max_norm=2", "layer.norm_axis=example"))
    assert (spec.max_norm, spec.norm_axis) == (2.0, "example")
    assert positions(api.compose("layer.positions=dense_2")) == ["dense_2"]
    assert positions(api.compose("model=keras", "model.build=my.models:build",
                                 "layer.positions=[encoder,head]")) == ["encoder", "head"]
    assert positions(api.compose("model=keras", "model.build=my.models:build",
                                 "layer.positions=3")) == ["3"]
