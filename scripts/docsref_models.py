"""Markdown tables of pydantic models for the generated reference pages: each field's key, type, default and
description, read from the model so the page changes when the model does."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ByteSize
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gpuevents.durations import Duration, exact_duration

_DURATION_META = get_args(Duration)[1:]


def _is_duration(metadata: list[Any] | tuple[Any, ...]) -> bool:
    return bool(metadata) and all(m in metadata for m in _DURATION_META)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds directly (`X` or `X | None`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        models = [m for a in get_args(annotation) if (m := _model_in(a)) is not None]
        return models[0] if len(models) == 1 else None
    return None


def type_name(annotation: Any, metadata: list[Any] | tuple[Any, ...] = ()) -> str:
    """A reader's name for a field's type: `duration`, `str | list[str]`, `"a" | "b"`, `map of str to X`."""
    if _is_duration(metadata):
        return "duration"
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0], args[1:])
    if origin in (Union, types.UnionType):
        names = [type_name(a) for a in args if a is not type(None)]
        return " | ".join(dict.fromkeys(names)) + (" | null" if type(None) in args else "")
    if origin is Literal:
        return " | ".join(f"`{a}`" if isinstance(a, str) else str(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}" if args else "map"
    if annotation is ByteSize:
        return "size (e.g. 3GiB)"
    if isinstance(annotation, type):
        if issubclass(annotation, Path):
            return "path"
        if issubclass(annotation, BaseModel):
            return "mapping"
        if issubclass(annotation, Enum):
            return " | ".join(f"`{m.value}`" for m in annotation)
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__)
    return str(annotation).replace("typing.", "")


def default_text(field: FieldInfo) -> str:
    """The default as a reader writes it in YAML; `required` when there is none."""
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "computed"
        if field.default_factory.__name__ == "gethostname":
            return "the host name"
    else:
        value = field.default
    if value is PydanticUndefined:
        return "required"
    if _is_duration(field.metadata) and isinstance(value, int | float):
        return f"`{exact_duration(value)}`"
    if isinstance(value, BaseModel):
        return "see below" if value.model_fields_set or value.model_fields else "`{}`"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, ByteSize):
        return f"`{value.human_readable()}`"
    if isinstance(value, dict | list) and not value:
        return "`{}`" if isinstance(value, dict) else "`[]`"
    return f"`{value}`"


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell: one line, `|` escaped, and `<name>` outside code spans kept as
    text rather than read as an HTML tag."""
    return as_text(" ".join(text.split())).replace("|", "\\|")


def as_text(text: str) -> str:
    """Markdown whose `<` and `>` outside code spans are shown, not read as HTML."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts)


def rows(model: type[BaseModel], prefix: str = "",
         describe: Callable[[str], str] | None = None) -> Iterator[tuple[str, str, str, str]]:
    """(key, type, default, description) for each field of `model`, nested models flattened to dotted keys;
    a field without a description of its own takes `describe(key)`."""
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        nested = _model_in(field.annotation)
        description = field.description or (describe(key) if describe else "")
        if nested is not None and not _is_map(field.annotation):
            yield key, "mapping", "", description
            yield from rows(nested, f"{key}.", describe)
            continue
        yield key, type_name(field.annotation, field.metadata), default_text(field), description
        inner = _map_value_model(field.annotation)
        if inner is not None:
            yield from rows(inner, f"{key}.<name>.", describe)
        item = _list_item_model(field.annotation)
        if item is not None:
            yield from rows(item, f"{key}[].", describe)


def _is_map(annotation: Any) -> bool:
    return get_origin(annotation) is dict


def _map_value_model(annotation: Any) -> type[BaseModel] | None:
    if get_origin(annotation) is dict:
        value = get_args(annotation)[1]
        return value if isinstance(value, type) and issubclass(value, BaseModel) else None
    return None


def _list_item_model(annotation: Any) -> type[BaseModel] | None:
    if get_origin(annotation) is list:
        item = get_args(annotation)[0]
        return item if isinstance(item, type) and issubclass(item, BaseModel) else None
    return None


def table(model: type[BaseModel], prefix: str = "", describe: Callable[[str], str] | None = None,
          skip: frozenset[str] = frozenset()) -> str:
    """The Markdown table of `model`'s fields (see `rows`), leaving out the keys in `skip`."""
    return table_of(r for r in rows(model, prefix, describe) if r[0] not in skip)


def table_of(found: Iterable[tuple[str, str, str, str]]) -> str:
    """The Markdown table of (key, type, default, description) rows."""
    lines = ["| key | type | default | what it is |", "| --- | --- | --- | --- |"]
    for key, kind, default, description in found:
        lines.append(f"| `{key}` | {cell(kind)} | {cell(default)} | {cell(description)} |")
    return "\n".join(lines) + "\n"
