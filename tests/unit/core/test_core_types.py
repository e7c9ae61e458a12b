"""The core's frozen values with hand-written constructors match their fields.

``ResolvedRecipient``, ``ReadRequest`` (``qmgrd.core.message``), ``Resolved``
(``qmgrd.core.resolve``) and ``MessageDone`` (``qmgrd.core.events``) set their slots
directly in their own ``__init__`` (cheaper than the generated one): a field added to the
class but not to its ``__init__`` would be left unset. These tests fail then.
"""

from __future__ import annotations

import pytest

from qmgrd.core.events import MessageDone
from qmgrd.core.message import Message, ReadRequest, ResolvedRecipient
from qmgrd.core.resolve import Resolved
from tests.support.frozen import assert_complete_and_frozen, assert_constructor_matches_fields

HAND_WRITTEN = (ResolvedRecipient, ReadRequest, Resolved, MessageDone)


@pytest.mark.parametrize("cls", HAND_WRITTEN, ids=lambda c: c.__name__)
def test_constructor_takes_every_field_in_order_with_its_default(cls: type) -> None:
    """The constructor's parameters are the dataclass fields, in order, with their defaults
    (none where the field has none; no default factories)."""
    assert_constructor_matches_fields(cls)


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
        assert_complete_and_frozen(obj)
    rr = ResolvedRecipient("a@b.example", 7, "smtp", "b.example", "b.example", payload="p")
    assert rr.payload == "p" and objs[0].payload is None
    assert rr != objs[0]
    assert ReadRequest(msg, 100, 6) != objs[1]
    assert Resolved(transport="smtp", nexthop="b.example", address="a@b.example") == objs[2]
