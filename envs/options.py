"""Options as frozen dataclasses: read the docstring under each field, check user-given values.

Configs across vecmarl (env options, training configs) are dataclasses with one docstring line under
each field. This module turns them into help text and builds them from user input with errors that
list every valid option with its type and default. A field that the code fills in, not the user
(an adapter's scenario name, taken from the env's name), is declared with `internal()` and left out
of the listings.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import textwrap
import typing
from typing import Any


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of dataclass `cls` (and its bases)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body
        for node, following in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def internal(**field_kwargs: Any) -> Any:
    """A dataclass field set by the code that builds the config, not by the user: `describe` leaves it
    out, so that errors never offer it as an option (`dataclasses.field`'s arguments)."""
    return dataclasses.field(metadata={"internal": True}, **field_kwargs)


def is_internal(field: dataclasses.Field) -> bool:
    return bool(field.metadata.get("internal"))


def field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def type_name(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if typing.get_args(tp):  # tuple[float, float], not just "tuple"
        return str(tp).replace("typing.", "").replace("NoneType", "None")
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "None")


def field_default(field: dataclasses.Field) -> Any:
    """The field's default (its factory's value), or `dataclasses.MISSING`."""
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def describe(cls: type, indent: str = "  ") -> str:
    """One line per option the user may set: `name: type = default  -- doc`."""
    docs, types = field_docs(cls), field_types(cls)
    lines = []
    for f in dataclasses.fields(cls):
        if not f.init or is_internal(f):
            continue
        default = field_default(f)
        default = "" if default is dataclasses.MISSING else f" = {default!r}"
        doc = docs.get(f.name, "")
        lines.append(f"{indent}{f.name}: {type_name(types[f.name])}{default}" + (f"  -- {doc}" if doc else ""))
    return "\n".join(lines)


def matches_type(value: Any, tp: Any) -> bool:
    """Whether `value` is acceptable for annotation `tp` (an int is a float; a bool is not an int)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(matches_type(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin in (tuple, list):
        args = typing.get_args(tp)
        if not isinstance(value, (tuple, list, range)):  # not a str: "64" is no sizes (6, 4)
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[float, float]: that many, each its type
            return len(value) == len(args) and all(matches_type(v, a) for v, a in zip(value, args))
        return all(matches_type(v, args[0]) for v in value) if args else True
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def check_fields(config: Any, skip: tuple[str, ...] = ()) -> None:
    """Every field of dataclass `config` (but those in `skip`) holds a value of its annotated type, as `build`
    checks options given by name: a config built in Python would otherwise take `hidden="64"` as the sizes
    (6, 4), `seed=1.5` as a seed, or fail in a comparison (`'<' not supported between 'str' and 'int'`).
    Then every float field is finite: range checks compare with `<` and `<=`, which are False for NaN, so a
    NaN (or inf) would pass them and silently break what reads it (a NaN radius makes every distance test
    False; max_grad_norm=nan turns gradient clipping off)."""
    fields = field_types(type(config))
    for name, tp in fields.items():
        value = getattr(config, name)
        if name not in skip and not matches_type(value, tp):
            raise TypeError(
                f"{type(config).__name__}: {name}={value!r} has type {type(value).__name__}, expected {type_name(tp)}"
            )
    for name, tp in fields.items():
        value = getattr(config, name)
        if tp is float and isinstance(value, (int, float)) and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")


def _literal_hint(name: str, value: Any, tp: Any) -> str:
    """For a bool option given the string "false" or "true" (`marl train --env-option flag=false`: the
    command line reads values as Python literals, and `false` is not one, so it stays a string)."""
    if not isinstance(value, str) or value.strip().lower() not in ("true", "false"):
        return ""
    literal = value.strip().lower() == "true"
    if not matches_type(literal, tp):
        return ""
    return f" (values are read as Python literals: write {name}={literal}, not {name}={value})"


def _in_field_form(value: Any, tp: Any) -> Any:
    """`value`, which matches `tp`, in the form the field declares: an int given for a float as a float, a
    list (JSON, Python) given for a tuple as a tuple of its item types, as a frozen config hashes them."""
    if tp is float:
        return float(value)
    if typing.get_origin(tp) is tuple and isinstance(value, (list, tuple)):
        args = typing.get_args(tp)
        if not args:
            return tuple(value)
        items = args[:1] * len(value) if args[1:] == (Ellipsis,) else args
        return tuple(_in_field_form(v, t) for v, t in zip(value, items, strict=True))
    return value


def build(cls: type, options: dict[str, Any], what: str) -> Any:
    """`cls(**options)`, with errors that name `what` and the bad option; an unknown or mistyped option
    also lists every valid one."""
    types = field_types(cls)
    valid = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(options) - valid)
    if unknown:
        raise TypeError(f"unknown option(s) {unknown} for {what}; valid options are:\n{describe(cls)}")
    for name, value in options.items():
        if not matches_type(value, types[name]):
            raise TypeError(
                f"option {name}={value!r} for {what} has type {type(value).__name__}, "
                f"expected {type_name(types[name])}{_literal_hint(name, value, types[name])}; "
                f"valid options are:\n{describe(cls)}"
            )
    values = {k: _in_field_form(v, types[k]) for k, v in options.items()}
    try:
        return cls(**values)
    except (ValueError, TypeError) as error:
        # The config's own check names the option and its range: the listing of every option would bury it.
        raise ValueError(f"invalid option for {what}: {error}") from None
