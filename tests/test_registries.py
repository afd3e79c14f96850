"""Each choice of a config group is named once per part: its YAML in conf/<group>/, its schema
class (gradexp/config/<group>.py) and its builder on the training side. They must agree."""

from __future__ import annotations

import pytest
import yaml

from conftest import CONF
from gradexp import config
from gradexp.parts import clipping, data, models, optimizers

GROUPS = {  # group: (schemas, builders)
    "model": (config.ModelConfig.OPTIONS, models.BUILDERS),
    "dataset": (config.DatasetConfig.OPTIONS, data.LOADERS),
    "optimizer": (config.OptimizerConfig.OPTIONS, optimizers.OPTIMIZERS),
    "clipping": (config.ClippingConfig.OPTIONS, clipping.METHODS),
}


BY_PATH = {"model": "keras", "dataset": "arrays", "clipping": "function", "optimizer": "keras"}


def extends(path) -> str:
    """The schema a YAML option extends (`/model_mlp_schema@_here_` -> mlp)."""
    first = yaml.safe_load(path.read_text())["defaults"][0]
    return first.split("@")[0].removeprefix(f"/{path.parent.name}_").removesuffix("_schema")


@pytest.mark.parametrize("group", GROUPS)
def test_every_yaml_has_a_schema_and_a_builder_and_every_schema_a_yaml(group):
    """An option of its own schema is named alike in all three; an option that names its code by
    a dotted path (model=keras, dataset=arrays, clipping=function, optimizer=keras) extends
    that schema and needs nothing else."""
    schemas, builders = GROUPS[group]
    paths = sorted((CONF / group).glob("*.yaml"))
    for path in paths:
        assert extends(path) in (path.stem, BY_PATH[group]), path
    yamls = sorted(p.stem for p in paths if extends(p) == p.stem)
    assert yamls, f"no conf/{group}/*.yaml"
    assert list(schemas) == yamls
    assert list(builders) == yamls
    for name, schema in schemas.items():  # registered under the name its YAML composes with
        assert schema().name == name


def test_a_name_without_a_builder_is_a_clear_error():
    with pytest.raises(config.NotRegistered,
                       match=r"^model=nosuch: no builder is registered under this name in "
                             r"gradexp/parts/models.py; registered: cnn, keras, mlp, rnn"):
        models.BUILDERS["nosuch"]


def test_two_choices_under_one_name_are_refused():
    registry = config.Registry("model", "builder", "here")
    registry.add("mlp")(test_a_name_without_a_builder_is_a_clear_error)
    with pytest.raises(ValueError, match="model=mlp: two builders"):
        registry.add("mlp")(test_two_choices_under_one_name_are_refused)
