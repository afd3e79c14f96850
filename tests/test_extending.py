"""A new clipping method, model and dataset take three places each: their code, their YAML,
their test. Here the code is a throwaway package and the YAMLs a config directory, both
outside gradexp: no file of gradexp is edited, and `python -m gradexp.train` trains with them
(docs/extending/ gives the recipe for each)."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd
import pytest

from conftest import gradexp

pytestmark = pytest.mark.slow  # runs gradexp end to end: the full tier only

CODE = {
    "throwaway/__init__.py": "",
    # a method with state: g <- factor * g, and a count of the steps it has clipped
    "throwaway/clip.py": '''
        from typing import NamedTuple

        import tensorflow as tf

        from gradexp.parts.clipping import Method
        from gradexp.parts.clipping.common import clip_stats, global_norm


        class Count(NamedTuple):
            steps: tf.Tensor


        def shrink(params, output_params, factor=0.5):
            def clip(grads, state, params):
                norm = global_norm(grads)
                out = [g * factor for g in grads]
                return out, Count(state.steps + 1.0), clip_stats(norm, out, factor, True)

            return Method("shrink", lambda: Count(tf.zeros([])), clip)
    ''',
    "throwaway/models.py": '''
        import keras


        def ladder(input_shape, num_outputs, rungs=2, width=8):
            x = inputs = keras.Input(input_shape)
            for i in range(rungs):
                x = keras.layers.Dense(width, activation="tanh", name=f"rung_{i}")(x)
            return keras.Model(inputs, keras.layers.Dense(num_outputs, name="top")(x))
    ''',
    "throwaway/data.py": '''
        import numpy as np


        def stripes(n=400, features=6):
            rng = np.random.default_rng(1)
            x = rng.normal(size=(n, features)).astype("float32")
            y = (x[:, 0] > 0).astype("int64") + 2 * (x[:, 1] > 0)
            return (x[: n // 2], y[: n // 2]), (x[n // 2 :], y[n // 2 :])
    ''',
    "my_conf/clipping/shrink.yaml": '''
        defaults:
          - /clipping_function_schema@_here_
          - _self_

        method: throwaway.clip:shrink
        kwargs:
          factor: 0.5
    ''',
    "my_conf/model/ladder.yaml": '''
        defaults:
          - /model_keras_schema@_here_
          - _self_

        build: throwaway.models:ladder
        kwargs:
          rungs: 3
    ''',
    "my_conf/dataset/stripes.yaml": '''
        defaults:
          - /dataset_arrays_schema@_here_
          - _self_

        load: throwaway.data:stripes
    ''',
}


def test_a_throwaway_method_model_and_dataset_train_without_editing_gradexp(tmp_path):
    for path, text in CODE.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text))
    result = gradexp("gradexp.train", "--config-dir", "my_conf", "clipping=shrink",
                     "model=ladder", "dataset=stripes", "clip=0.1", "trainer.steps=40",
                     "trainer.log_every=10", "trainer.checkpoint_every=20", "hydra.run.dir=run",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["data"]["input_shape"] == [6] and summary["data"]["num_classes"] == 4
    table = pd.read_csv(run / "metrics.csv")
    # the model: three rungs, each with a clip layer; the method: every step halved
    assert [c for c in table if c.startswith("clip_fraction/")] == [
        "clip_fraction/rung_0", "clip_fraction/rung_1", "clip_fraction/rung_2"]
    np.testing.assert_allclose(table["grad_norm/global/post"],
                               0.5 * table["grad_norm/global"], rtol=1e-6)
    assert (table["param_clip/threshold"] == 0.5).all()
    # the method's state is carried and checkpointed under its name
    from tensorflow.train import list_variables

    names = dict(list_variables(str(run / "checkpoints")))
    carried = [n for n in names if "shrink" in n or "clipping" in n]
    assert carried, sorted(names)
    from tensorflow.train import load_checkpoint

    reader = load_checkpoint(str(run / "checkpoints"))
    assert [reader.get_tensor(n) for n in carried if n.endswith("VARIABLE_VALUE")] == [40.0]
