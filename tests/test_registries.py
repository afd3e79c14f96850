"""Each choice of a config group is named once per part: its YAML in conf/<group>/, its schema
class (gradexp/config/<group>.py) and its builder on the training side. They must agree."""

from __future__ import annotations

import pytest

from conftest import CONF
from gradexp import clipping, config, data, models, optimizers

GROUPS = {  # group: (schemas, builders)
    "model": (config.ModelConfig.OPTIONS, models.BUILDERS),
    "dataset": (config.DatasetConfig.OPTIONS, data.LOADERS),
    "optimizer": (config.OptimizerConfig.OPTIONS, optimizers.OPTIMIZERS),
    "clipping": (config.ClippingConfig.OPTIONS, clipping.METHODS),
}


@pytest.mark.parametrize("group", GROUPS)
def test_every_yaml_has_a_schema_and_a_builder_and_every_schema_a_yaml(group):
    schemas, builders = GROUPS[group]
    yamls = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    assert yamls, f"no conf/{group}/*.yaml"
    assert list(schemas) == yamls
    assert list(builders) == yamls
    for name, schema in schemas.items():  # registered under the name its YAML composes with
        assert schema().name == name


def test_a_name_without_a_builder_is_a_clear_error():
    with pytest.raises(config.NotRegistered, match=r"^model=nosuch: no builder is registered "
                       r"under this name in gradexp/models.py; registered: cnn, keras, mlp, rnn"):
        models.BUILDERS["nosuch"]


def test_two_choices_under_one_name_are_refused():
    registry = config.Registry("model", "builder", "here")
    registry.add("mlp")(test_a_name_without_a_builder_is_a_clear_error)
    with pytest.raises(ValueError, match="model=mlp: two builders"):
        registry.add("mlp")(test_two_choices_under_one_name_are_refused)
