"""The core's frozen values with hand-written constructors match their fields.

``ResolvedRecipient``, ``ReadRequest`` (``qmgrd.core.message``), ``Resolved``
(``qmgrd.core.resolve``) and ``MessageDone`` (``qmgrd.core.events``) set their slots
directly in their own ``__init__`` (cheaper than the generated one): a field added to the
class but not to its ``__init__`` would be left unset. These tests fail then.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from qmgrd.core.events import MessageDone
from qmgrd.core.message import Message, ReadRequest, ResolvedRecipient
from qmgrd.core.resolve import Resolved

HAND_WRITTEN = (ResolvedRecipient, ReadRequest, Resolved, MessageDone)


@pytest.mark.parametrize("cls", HAND_WRITTEN, ids=lambda c: c.__name__)
def test_constructor_takes_every_field_in_order(cls: type) -> None:
    """The constructor's parameters are the dataclass fields, in order."""
    params = list(inspect.signature(cls).parameters)
    assert params == [f.name for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("cls", HAND_WRITTEN, ids=lambda c: c.__name__)
def test_constructor_defaults_are_the_fields(cls: type) -> None:
    """Each parameter's default is its field's default (none where the field has none)."""
    signature = inspect.signature(cls).parameters
    for f in dataclasses.fields(cls):
        default = signature[f.name].default
        if f.default is not dataclasses.MISSING:
            assert default == f.default, f.name
        else:
            assert f.default_factory is dataclasses.MISSING, f.name
            assert default is inspect.Parameter.empty, f.name


def test_built_objects_are_complete_frozen_and_compare_by_value() -> None:
    """Every slot is set, assignment refuses, and ==/hash are the fields'."""
    msg = Message("Q1", 0.0, 1, 10)
    objs = (
        ResolvedRecipient("a@b.example", 7, "smtp", "b.example", "b.example"),
        ReadRequest(msg, 100, 5),
        Resolved("smtp", "b.example", "a@b.example"),
        MessageDone(msg),
    )
    for obj in objs:
        for f in dataclasses.fields(obj):
            getattr(obj, f.name)  # every slot was set
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, dataclasses.fields(obj)[0].name, None)
        twin = dataclasses.replace(obj)
        assert twin == obj and hash(twin) == hash(obj) and twin is not obj
    rr = ResolvedRecipient("a@b.example", 7, "smtp", "b.example", "b.example", payload="p")
    assert rr.payload == "p" and objs[0].payload is None
    assert rr != objs[0]
    assert ReadRequest(msg, 100, 6) != objs[1]
    assert Resolved(transport="smtp", nexthop="b.example", address="a@b.example") == objs[2]
