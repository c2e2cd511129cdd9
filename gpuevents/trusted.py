"""Building pydantic models from values already valid, at the cost of a dict: `model_construct` without its walk.

`Builder(Model)(**values)` gives the model `Model.model_construct(**values)` would give (the same `__dict__`, in
field order, the same fields set, defaults copied as pydantic copies them), without `model_construct`'s per-field
alias lookups and default-factory inspection (pydantic inspects a factory's signature at every call: ~20 µs for
one incident). Only for values the caller made itself: nothing is validated.

A frozen model never changes its set of fields set in place (pydantic copies it in `model_copy`), so the frozen
models built here share one such set per distinct set of names, as do the copies `updated` makes: an incident's
own set was nearly half of its memory.
"""

from __future__ import annotations

import copy
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

_IMMUTABLE = (type(None), bool, int, float, str, bytes, tuple, frozenset)
_PLAIN, _COPY, _FACTORY = 0, 1, 2


class Builder(Generic[M]):
    """Constructs `model` from trusted keyword values; see the module's docstring."""

    __slots__ = ("_defaults", "_fields", "_model", "_names", "_sets")

    def __init__(self, model: type[M]) -> None:
        cfg = model.model_config
        if (cfg.get("extra") == "allow" or model.__pydantic_root_model__ or model.__private_attributes__
                or model.__pydantic_post_init__):
            raise TypeError(f"{model.__name__}: not a plain model; use model_construct")
        self._model = model
        fields = model.__pydantic_fields__
        if any(f.alias not in (None, n) or f.validation_alias is not None for n, f in fields.items()):
            raise TypeError(f"{model.__name__}: has aliases; use model_construct")
        self._fields = tuple(fields)
        self._names = frozenset(fields)
        defaults: dict[str, tuple[int, Any]] = {}  # name -> (how: _PLAIN, _COPY or _FACTORY, default or factory)
        for n, f in fields.items():
            if f.default_factory is not None:
                if f.default_factory_takes_validated_data:
                    raise TypeError(f"{model.__name__}.{n}: a factory that reads the data; use model_construct")
                defaults[n] = (_FACTORY, f.default_factory)
            elif not f.is_required():
                defaults[n] = (_PLAIN if isinstance(f.default, _IMMUTABLE) else _COPY, f.default)
        self._defaults = defaults
        self._sets: dict[frozenset[str], set[str]] | None = {} if cfg.get("frozen") else None

    def __call__(self, **values: Any) -> M:
        out: dict[str, Any] = {}
        defaults = self._defaults
        for n in self._fields:
            if n in values:
                out[n] = values[n]
            else:
                d = defaults.get(n)
                if d is None:
                    continue  # a required field left out: absent, as model_construct leaves it
                how, value = d
                out[n] = value if how == _PLAIN else value() if how == _FACTORY else copy.deepcopy(value)
        m = self._model.__new__(self._model)
        setattr_ = object.__setattr__
        setattr_(m, "__dict__", out)
        fields_set = set(values)
        if not fields_set <= self._names:
            fields_set &= self._names
        if self._sets is not None:
            fields_set = _shared(self._sets, fields_set)
        setattr_(m, "__pydantic_fields_set__", fields_set)
        setattr_(m, "__pydantic_extra__", None)
        setattr_(m, "__pydantic_private__", None)
        return m


_MAX_SETS = 1024
"""Distinct sets of names a frozen model shares at most (a model has a few in practice); past it, each has its own."""
_UPDATED_SETS: dict[tuple[type[BaseModel], frozenset[str]], set[str]] = {}


def _shared(sets: dict[frozenset[str], set[str]], names: set[str]) -> set[str]:
    key = frozenset(names)
    found = sets.get(key)
    if found is not None:
        return found
    if len(sets) < _MAX_SETS:
        sets[key] = names
    return names


def updated(model: M, update: dict[str, Any]) -> M:
    """`model.model_copy(update=update)` for a frozen model and trusted values of its own fields: the same
    `__dict__` and fields set, the set shared with the other copies (see the module's docstring)."""
    cls = type(model)
    if not cls.model_config.get("frozen") or model.__pydantic_extra__ is not None or (
        model.__pydantic_private__ is not None
    ):
        return model.model_copy(update=update)
    m = cls.__new__(cls)
    setattr_ = object.__setattr__
    out = model.__dict__.copy()
    out.update(update)
    setattr_(m, "__dict__", out)
    names = model.__pydantic_fields_set__
    if not update.keys() <= names:
        key = (cls, frozenset(names | update.keys()))
        names = _UPDATED_SETS.get(key) or set(key[1])
        if len(_UPDATED_SETS) < _MAX_SETS:
            _UPDATED_SETS.setdefault(key, names)
    setattr_(m, "__pydantic_fields_set__", names)
    setattr_(m, "__pydantic_extra__", None)
    setattr_(m, "__pydantic_private__", None)
    return m
