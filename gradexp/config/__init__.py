"""Config schemas by group (mirroring conf/), their validation and their registration with
Hydra. Nothing here imports TensorFlow: a bad value is answered before that slow import.

    base        ConfigError, the checks that raise it, the registry of a group's choices
    model, dataset, optimizer, clipping    each group's schemas, one class per choice
    layer       the clip layers' settings, resolved into a ClipSpec
    trainer     the training loop's settings
    root        the root schema and `validate`
    hydra_glue  ConfigStore, resolvers, sweep expansion, Hydra's errors in one line,
                each job of a sweep composed once

Types and key names are checked by Hydra when it composes the config (the schemas are in its
ConfigStore once this package is imported); values, choices and combinations by `validate`.
"""

from gradexp.config.base import (
    Choice,
    ConfigError,
    NotRegistered,
    Registry,
    at_least,
    finite,
    import_object,
    need,
    one_of,
)
from gradexp.config.clipping import ClippingConfig
from gradexp.config.dataset import DatasetConfig
from gradexp.config.hydra_glue import (
    check_overrides,
    compose_once,
    explain,
    register,
    sweep_jobs,
    task_config,
)
from gradexp.config.layer import NORM_AXES, ClipSpec, LayerConfig, clip_bounds, clip_spec, positions
from gradexp.config.model import ModelConfig, check_model_takes, input_kind
from gradexp.config.optimizer import OptimizerConfig
from gradexp.config.root import TEST_SPLITS, Config, validate
from gradexp.config.trainer import TrainerConfig

__all__ = [
    "NORM_AXES", "TEST_SPLITS", "Choice", "ClipSpec", "ClippingConfig", "Config", "ConfigError",
    "DatasetConfig", "LayerConfig", "ModelConfig", "NotRegistered", "OptimizerConfig",
    "Registry", "TrainerConfig", "at_least", "check_model_takes", "check_overrides", "clip_bounds",
    "clip_spec", "compose_once", "explain", "finite", "import_object", "input_kind", "need",
    "one_of", "positions", "register", "sweep_jobs", "task_config", "validate",
]
