"""Checks for frozen slotted dataclasses whose ``__init__`` is written by hand.

Hot per-message values (delivery requests, core records, spool records) keep
``@dataclass(frozen=True, slots=True)`` for their ==, hash and repr but set
their slots in their own ``__init__`` (cheaper than the generated one). A
field added to the class and not to that ``__init__`` would be left unset:

``assert_constructor_matches_fields(cls)``: the parameters are the fields, in
order, each with its field's default; a field with a default factory is
refused unless ``factory_default_none`` (the constructor then takes ``None``
and builds a fresh value). ``assert_complete_and_frozen(obj)``: every slot is
set and assignment refuses; with ``twin`` also a ``dataclasses.replace`` copy
is equal (and, with ``hashable``, hashes the same).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest


def assert_constructor_matches_fields(cls: type, *, factory_default_none: bool = False) -> None:
    """``cls``'s constructor takes every field, in order, with the fields' defaults."""
    params = inspect.signature(cls).parameters
    assert list(params) == [f.name for f in dataclasses.fields(cls)]
    for f in dataclasses.fields(cls):
        default = params[f.name].default
        if f.default is not dataclasses.MISSING:
            assert default == f.default, f.name
        elif f.default_factory is not dataclasses.MISSING:
            assert factory_default_none, f"{f.name}: a default factory"
            assert default is None, f.name  # None: a fresh value from the factory
        else:
            assert default is inspect.Parameter.empty, f.name


def assert_complete_and_frozen(obj: Any, *, twin: bool = True, hashable: bool = True) -> None:
    """Every slot of ``obj`` is set, assignment refuses; a copy compares (and hashes) equal."""
    fields = dataclasses.fields(obj)
    for f in fields:
        getattr(obj, f.name)  # every slot was set
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, fields[0].name, None)
    if twin:
        copy = dataclasses.replace(obj)
        assert copy == obj and copy is not obj
        if hashable:
            assert hash(copy) == hash(obj)
