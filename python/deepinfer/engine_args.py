"""Command-line flags for EngineConfig, shared by ``deepinfer serve``, ``generate`` and ``chat``.

Every EngineConfig field becomes a flag, derived from the dataclass, so a new field appears on every command by
itself; its help is the field's line in ``ENGINE_FIELD_HELP`` plus its default. Flags leave their values unset
(argparse.SUPPRESS) unless given, so only what a user types overrides EngineConfig's defaults (or a serve
``--config`` file).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import typing
from collections.abc import Iterator
from typing import Any

from deepinfer.config import ENGINE_FIELD_HELP, EngineConfig

__all__ = ["add_engine_arguments", "engine_values", "engine_field_help", "finite_float", "ENGINE_VALUE_NAMES"]

# Engine values a command line may carry: the fields, and quantization's JSON spelling.
ENGINE_VALUE_NAMES = (frozenset(f.name for f in dataclasses.fields(EngineConfig))
                      | {"quantization_config", "num_speculative_tokens"})
_METAVARS = {"model_name_or_path": "PATH", "tokenizer": "PATH", "served_model_name": "NAME", "revision": "REV",
             "download_dir": "DIR"}


def finite_float(text: str) -> float:
    """argparse type: a float that is not NaN or infinite (``float()`` accepts 'nan' and 'inf')."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


finite_float.__name__ = "float"  # argparse names the type in its "invalid float value" message


def _none_or(convert: Any) -> Any:
    def parse(text: str) -> Any:
        if text.lower() in ("none", "null"):
            return None
        return convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def json_or_str(text: str) -> Any:
    """A structured value given on the command line: JSON when it looks like JSON, else the string."""
    if text.lower() in ("none", "null"):
        return None
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {e}") from None
    return text


def json_object(text: str) -> Any:
    if text.lower() in ("none", "null"):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _scalar_type(tp: Any) -> tuple[type | None, bool]:
    """(the scalar type int/float/str/bool behind an annotation, or None; whether None is allowed)."""
    if tp in (int, float, str, bool):
        return tp, False
    args = typing.get_args(tp)
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in (int, float, str, bool):
            return rest[0], True
        return None, True
    return None, False


def _engine_fields() -> Iterator[tuple[dataclasses.Field, Any]]:
    try:
        hints = typing.get_type_hints(EngineConfig)
    except Exception:  # an annotation that cannot be evaluated here: fall back to the defaults' types
        hints = {}
    for f in dataclasses.fields(EngineConfig):
        tp = hints.get(f.name)
        if tp is None and f.default is not dataclasses.MISSING and f.default is not None:
            tp = type(f.default)
        yield f, tp


def _flag_names(name: str) -> list[str]:
    if name == "model_name_or_path":
        return ["--model", "--model-name-or-path"]
    return ["--" + name.replace("_", "-")]


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _format_default(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return repr(value) if isinstance(value, str) else str(value)


def engine_field_help(name: str) -> str:
    """One field's flag help: what it means, then its default. A field without an ENGINE_FIELD_HELP line is a
    programming error (a test checks every field), named here rather than shown as an empty help."""
    field = next(f for f in dataclasses.fields(EngineConfig) if f.name == name)
    try:
        meaning = ENGINE_FIELD_HELP[name]
    except KeyError:
        raise KeyError(f"EngineConfig.{name} has no line in deepinfer.config.ENGINE_FIELD_HELP") from None
    # '%' would start an argparse format specifier in a help string.
    return f"{meaning} (default: {_format_default(_default_of(field))})".replace("%", "%%")


def add_engine_arguments(parser: argparse.ArgumentParser,
                         group: argparse._ArgumentGroup | None = None) -> None:
    """Adds one flag per EngineConfig field (and --quantization-config) to ``group`` (default: a new "engine"
    group of ``parser``). A flag ``parser`` already has (a server flag of the same name) wins over the field's."""
    S = argparse.SUPPRESS
    if group is None:
        group = parser.add_argument_group("engine", "EngineConfig fields (see deepinfer.EngineConfig)")
    taken = {opt for action in parser._actions for opt in action.option_strings}
    for f, tp in _engine_fields():
        names = [n for n in _flag_names(f.name) if n not in taken]
        if not names:
            continue
        help_text = engine_field_help(f.name)
        scalar, nullable = _scalar_type(tp)
        if scalar is bool and not nullable:
            group.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=S, help=help_text)
        elif scalar is not None:
            base = finite_float if scalar is float else scalar
            convert = _none_or(base) if nullable else base
            group.add_argument(*names, dest=f.name, type=convert, default=S,
                               metavar=_METAVARS.get(f.name, scalar.__name__.upper()),
                               help=help_text)  # a nullable field's help line says what 'none' means
        else:
            group.add_argument(*names, dest=f.name, type=json_or_str, default=S, metavar="VALUE",
                               help=help_text + "; a string or JSON")
        taken.update(names)
    if "--quantization-config" not in taken:
        group.add_argument("--quantization-config", dest="quantization_config", type=json_object, default=S,
                           metavar="JSON",
                           help='quantization as a JSON object, e.g. {"method": "fp8", "group_size": 128}')
    if "--num-speculative-tokens" not in taken:
        group.add_argument("--num-speculative-tokens", dest="num_speculative_tokens", type=int, default=S,
                           metavar="K", help="MTP speculative decoding with K draft tokens a step (the same as "
                           '--speculative-config \'{"method": "mtp", "num_speculative_tokens": K}\') (default: none)')


def engine_values(args: argparse.Namespace) -> dict[str, Any]:
    """The engine values given on the command line (EngineConfig.from_dict takes them)."""
    return {k: v for k, v in vars(args).items() if k in ENGINE_VALUE_NAMES}
