"""The generated reference of every config key (docs/config.md is written from it)."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from reprotune._config.schema import ExperimentConfig, submodel


@dataclass(frozen=True)
class ConfigKey:
    """One leaf key of the schema, for the reference in docs/config.md."""

    path: str
    type: str
    default: Any
    description: str


def config_keys() -> list[ConfigKey]:
    """Every leaf key of the config schema, in schema order."""
    keys: list[ConfigKey] = []
    defaults = ExperimentConfig().resolved()
    for section, section_field in ExperimentConfig.model_fields.items():
        model = submodel(section_field.annotation)
        if model is None:  # a top-level value (config_dir), not a section
            keys.append(
                ConfigKey(
                    section,
                    _type_name(section_field.annotation),
                    defaults[section],
                    section_field.description or "",
                )
            )
            continue
        for name, field in model.model_fields.items():
            keys.append(
                ConfigKey(
                    f"{section}.{name}",
                    _type_name(field.annotation),
                    defaults[section][name],
                    field.description or "",
                )
            )
    return keys


def section_docs() -> dict[str, str]:
    """Section name -> the section's one-line description."""
    out = {}
    for section, field in ExperimentConfig.model_fields.items():
        model = submodel(field.annotation)
        out[section] = (model.__doc__ or "").strip().splitlines()[0] if model else "A top-level value."
    return out


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(repr(a) for a in args).replace("'", "")
    if origin is Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is tuple:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return f"mapping[{_type_name(args[0])}, {_type_name(args[1])}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))
