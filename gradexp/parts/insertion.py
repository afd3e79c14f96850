"""A Keras model of the user's (`model=keras model.build=my_pkg.models:make`), with clip layers
inserted at positions named by the model's own layers.

`make(input_shape, num_outputs, **model.kwargs)` returns a Functional or Sequential model; a
position is a layer's name (inside a nested model, `outer/inner`), glob patterns allowed
(`layer.positions=[dense*]`); `all` is the output of every layer with weights but the last. The
graph is rebuilt with a `ClipGradient` layer on each chosen layer's output (named `clip_<path>`,
`/` written `.`), the model's own layers (their weights and names) reused as they are: at
`layer.scale=1` the outputs are the model's to the last bit. A subclassed model has no graph to
rebuild: it holds ClipGradient layers of its own, found by `models.clip_layers`, and names no
positions (`all` and `[]` take it as it is).
"""

from __future__ import annotations

from collections.abc import Callable
from fnmatch import fnmatchcase

from omegaconf import DictConfig, OmegaConf

from gradexp._tf import keras
from gradexp.config import ConfigError, import_object

Functional = keras.src.models.functional.Functional


def users_model(m: DictConfig, input_shape: tuple[int, ...], num_outputs: int) -> keras.Model:
    """The model `m.build` returns for these shapes, checked: a Keras model whose output is
    (batch, num_outputs)."""
    make = import_object("model.build", m.build)
    model = make(tuple(input_shape), num_outputs, **OmegaConf.to_container(m.kwargs))
    if not isinstance(model, keras.Model):
        raise ConfigError(f"model.build={m.build}: returned {type(model).__name__}, "
                          "not a Keras model")
    shape = (None, *tuple(model(keras.ops.zeros((1, *input_shape))).shape[1:]))  # builds it
    if shape != (None, num_outputs):
        raise ConfigError(f"model.build={m.build}: its output has shape {shape}; the dataset "
                          f"needs (None, {num_outputs}) (num_outputs={num_outputs})")
    return model


def layer_paths(model: keras.Model, prefix: str = "") -> dict[str, keras.Layer]:
    """Every layer of the model by path, in model order (a nested model's own, then its
    layers'), the inputs left out."""
    paths = {}
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        paths[prefix + layer.name] = layer
        if isinstance(layer, (Functional, keras.Sequential)):
            paths.update(layer_paths(layer, f"{prefix}{layer.name}/"))
    return paths


def choose(model: keras.Model, wanted, build: str) -> list[str]:
    """The paths `wanted` names (`all`, or a list of names and glob patterns), in model order;
    ConfigError for a pattern that matches no layer, naming the layers there are."""
    paths = layer_paths(model)
    graph = isinstance(model, (Functional, keras.Sequential))
    if wanted == "all" and not graph:
        return []  # a subclassed model's clip layers are its own
    if wanted == "all":
        last = model.layers[-1].name
        return [p for p, layer in paths.items() if layer.weights and p != last
                and not isinstance(layer, (Functional, keras.Sequential))]
    wanted = [wanted] if isinstance(wanted, str) else list(wanted)
    if wanted and not graph:
        raise ConfigError(
            f"model.build={build}: returns a subclassed model ({type(model).__name__}), whose "
            "layers cannot be rebuilt with clip layers; put gradexp.layers.ClipGradient layers "
            "inside it and leave layer.positions at all, or [] (gradexp finds and measures them)")
    for pattern in wanted:
        if not any(fnmatchcase(p, pattern) for p in paths):
            raise ConfigError(f"layer.positions={pattern}: matches no layer of {model.name}; "
                              f"its layers: {', '.join(paths)}")
    return [p for p in paths if any(fnmatchcase(p, pattern) for pattern in wanted)]


def with_clip_layers(model: keras.Model, chosen: list[str],
                     make_layer: Callable[[str], keras.Layer], prefix: str = "") -> keras.Model:
    """The model rebuilt with `make_layer(path)` on the output of each chosen layer; its own
    layers reused (same weights), a nested model rebuilt the same way where it holds one."""
    if not chosen:
        return model
    if isinstance(model, keras.Sequential):  # no call_function there: as a Functional model
        inputs = keras.Input(batch_shape=model.inputs[0].shape, name="inputs")
        x = inputs
        for layer in model.layers:
            x = _clip_output(layer, layer(x), prefix, chosen, make_layer)
        return keras.Model(inputs, x, name=model.name)

    def clone(layer):
        inner = f"{prefix}{layer.name}/"
        if (isinstance(layer, (Functional, keras.Sequential))
                and any(p.startswith(inner) for p in chosen)):
            return with_clip_layers(layer, chosen, make_layer, inner)
        return layer

    def call(layer, *args, **kwargs):
        return _clip_output(layer, layer(*args, **kwargs), prefix, chosen, make_layer)

    return keras.models.clone_model(model, clone_function=clone, call_function=call)


def _clip_output(layer, output, prefix: str, chosen: list[str], make_layer):
    path = prefix + layer.name
    if path not in chosen:
        return output
    if not hasattr(output, "shape"):
        raise ConfigError(f"layer.positions: {path} has several outputs; choose a layer "
                          "with one")
    return make_layer(path)(output)


def position_name(path: str) -> str:
    """A path as a position's name in logs and layer names (Keras names hold no `/`)."""
    return path.replace("/", ".")


def position_lines(cfg: DictConfig) -> list[str]:
    """What `--positions` prints: the positions the model of `cfg` offers, in model order, with
    their output shapes for a user's model, `*` where the run's layer.positions puts one."""
    from gradexp import config
    from gradexp.parts import data

    chosen = config.positions(cfg)
    if cfg.model.name != "keras":
        return [f"{p}{'  *' if p in chosen else ''}"
                for p in OmegaConf.to_object(cfg.model).positions()]
    arrays = data.load(cfg.dataset)
    model = users_model(cfg.model, arrays.input_shape, arrays.num_outputs)
    chosen = choose(model, "all" if chosen == ["all"] else chosen, cfg.model.build)
    width = max(map(len, layer_paths(model)), default=0)
    return [f"{p:<{width}}  {type(layer).__name__:<20} {_output_shape(layer)}"
            f"{'  *' if p in chosen else ''}" for p, layer in layer_paths(model).items()]


def _output_shape(layer) -> str:
    try:
        return str(tuple(layer.output.shape))
    except (AttributeError, ValueError):  # a subclassed model's layer: no graph to ask
        return ""
