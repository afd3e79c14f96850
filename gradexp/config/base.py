"""What every config module shares: the one-line ConfigError, the checks that raise it, and the
registry by which each choice of a config group is found by its name.

A group (model, dataset, optimizer, clipping) has a base schema class deriving from `Choice`;
every subclass whose `name` has a default is registered under it, in the group's `OPTIONS`.
The training side keeps its own `Registry` per group (builders, loaders, methods, optimizers),
filled by a decorator on each function. Adding a choice is then: its function, its schema class,
its YAML in conf/<group>/, its test; nothing else lists it. tests/test_registries.py checks
that the YAMLs, the schemas and the builders name the same choices.

Nothing in gradexp.config imports TensorFlow: a bad value is answered before that slow import.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from omegaconf import MISSING

T = TypeVar("T")


class ConfigError(ValueError):
    """A bad setting: the message is one line that names the key and what is allowed."""


def need(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise ConfigError('key=value: allowed') unless ok."""
    if not ok:
        raise ConfigError(f"{key}={show(value)}: {allowed}")


def show(value: Any) -> str:
    """A value as the user typed it (None as null)."""
    return "null" if value is None else str(value)


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    need(value in allowed, key, value, f"must be one of {', '.join(allowed)}")


def at_least(node: Any, minimum: int, *keys: str) -> None:
    """Each of the integer settings `keys` of `node` at least `minimum`."""
    for key in keys:
        value = getattr(node, key)
        need(value >= minimum, key, value, f"must be an integer >= {minimum}")


def check_positive(key: str, value: float) -> None:
    need(finite(value) and value > 0, key, value, "must be a positive number")


DOTTED_PATH = "a dotted path such as my_package.module:function"  # what import_object takes


def import_object(key: str, path: str) -> Any:
    """The object a dotted path names, `package.module:attribute` or `package.module.attribute`
    (the user's model builder, data loader, ...); ConfigError naming `key` if it does not import.
    The module is imported from the working directory too, as `python -m` would."""
    import importlib
    import sys

    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    need(bool(module_name and attribute), key, path, f"must be {DOTTED_PATH}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.append("")  # a user's module beside where gradexp runs
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{key}={path}: cannot import {module_name} ({exc})") from None
    thing = module
    for part in attribute.split("."):
        if not hasattr(thing, part):
            raise ConfigError(f"{key}={path}: {module_name} has no {attribute}")
        thing = getattr(thing, part)
    return thing


def any_keys() -> Any:
    """An empty node that takes keys no schema declares (a function's keyword arguments):
    `dataset.kwargs.n=300` adds `n` (in a node of the struct config, a new key needs a `+`)."""
    from omegaconf import DictConfig

    return DictConfig({}, flags={"struct": False})


def schema_keys(schema: Any) -> list[str]:
    """The keys a schema dataclass declares, in order."""
    return [f.name for f in dataclasses.fields(schema)]


class NotRegistered(LookupError):
    """A name with nothing registered under it: a choice whose code is missing (a YAML and a
    schema without a builder, say). Not the user's mistake, so not a ConfigError."""


class Registry:
    """name -> one thing of one kind (schema, builder, ...) for one config group.

    `add(name)` is a decorator; `registry[name]` raises NotRegistered, naming what is known.
    """

    def __init__(self, group: str, kind: str, where: str):
        self.group, self.kind, self.where = group, kind, where
        self._entries: dict[str, Any] = {}

    def add(self, name: str) -> Callable[[T], T]:
        def register(thing: T) -> T:
            old = self._entries.get(name)
            if old is not None and _origin(old) != _origin(thing):  # a reload is no clash
                raise ValueError(f"{self.group}={name}: two {self.kind}s, {_origin(old)} "
                                 f"and {_origin(thing)}")
            self._entries[name] = thing
            return thing

        return register

    def __getitem__(self, name: str) -> Any:
        try:
            return self._entries[name]
        except KeyError:
            raise NotRegistered(
                f"{self.group}={name}: no {self.kind} is registered under this name in "
                f"{self.where}; registered: {', '.join(sorted(self._entries))}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def items(self) -> list[tuple[str, Any]]:
        return sorted(self._entries.items())


def _origin(thing: Any) -> str:
    return f"{thing.__module__}.{thing.__qualname__}"


@dataclass
class Choice:
    """Base of the option schemas of one config group. A group's base class sets `OPTIONS`,
    a Registry of schemas; each subclass with a default `name` is registered under that name
    (an intermediate class, whose name is MISSING, is not). `check` raises ConfigError for a
    bad value, naming keys relative to the group (`validate` adds the group's name in front).
    """

    name: str = MISSING
    OPTIONS: ClassVar[Registry]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "OPTIONS" in cls.__dict__:  # the group's base class
            return
        name = cls.__dict__.get("name", MISSING)
        if name != MISSING:
            cls.OPTIONS.add(name)(cls)

    def check(self) -> None:
        pass
