"""clipping=function: a method given by a dotted path to its factory, no schema of its own.

    clipping=function clipping.method=my_pkg.clip:make clipping.kwargs.factor=0.5

`make(params, output_params, **kwargs)` returns a gradexp/parts/clipping/common.py `Method(name,
initial, clip)`: `initial()` its state, `clip(present_grads, state, params) -> (grads, state,
stats)` (docs/extending/clipping-method.md).
"""

from __future__ import annotations

from omegaconf import OmegaConf

from gradexp.config import ConfigError, import_object
from gradexp.parts.clipping.common import Method, method


@method("function")
def by_dotted_path(c, params, output_params) -> Method:
    make = import_object("clipping.method", c.method)
    try:
        made = make(params, output_params, **OmegaConf.to_container(c.kwargs))
    except TypeError as exc:
        raise ConfigError(f"clipping.kwargs: {c.method} refused them ({exc})") from None
    if not isinstance(made, Method):
        raise ConfigError(f"clipping.method={c.method}: returned {type(made).__name__}, "
                          "not a gradexp.parts.clipping.Method")
    return made
