"""The delivery types' hand-written constructors (``qmgrd.delivery.agent``) match their fields.

``Recipient``, ``DeliveryRequest``, ``RecipientResult`` and ``DeliveryResult`` are frozen
slotted dataclasses with their own ``__init__`` (cheaper than the generated one): a field
added to the class but not to its ``__init__`` would be left unset. These tests fail then.
"""

from __future__ import annotations

import pytest

from qmgrd.delivery.agent import (
    DeliveryRequest,
    DeliveryResult,
    Outcome,
    Recipient,
    RecipientResult,
)
from tests.support.frozen import assert_complete_and_frozen, assert_constructor_matches_fields

HAND_WRITTEN = (Recipient, DeliveryRequest, RecipientResult, DeliveryResult)


@pytest.mark.parametrize("cls", HAND_WRITTEN, ids=lambda c: c.__name__)
def test_constructor_takes_every_field_in_order_with_its_default(cls: type) -> None:
    """The fields, in order, with their defaults; None for a field with a default factory."""
    assert_constructor_matches_fields(cls, factory_default_none=True)


def test_built_objects_are_complete_and_frozen() -> None:
    rcpt = Recipient("a@b.example", 7)
    result = DeliveryResult((RecipientResult(rcpt, Outcome.SENT, "2.0.0", "250 ok"),))
    assert result.extra == {} and result.extra is not DeliveryResult(()).extra
    assert result == DeliveryResult(
        (RecipientResult(Recipient("a@b.example", 7), Outcome.SENT, "2.0.0", "250 ok"),)
    )
    for obj in (rcpt, result, result.recipients[0]):
        assert_complete_and_frozen(obj, twin=False)
