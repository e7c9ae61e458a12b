"""The delivery types' hand-written constructors (``qmgrd.delivery.agent``) match their fields.

``Recipient``, ``DeliveryRequest``, ``RecipientResult`` and ``DeliveryResult`` are frozen
slotted dataclasses with their own ``__init__`` (cheaper than the generated one): a field
added to the class but not to its ``__init__`` would be left unset. These tests fail then.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from qmgrd.delivery.agent import (
    DeliveryRequest,
    DeliveryResult,
    Outcome,
    Recipient,
    RecipientResult,
)

HAND_WRITTEN = (Recipient, DeliveryRequest, RecipientResult, DeliveryResult)


@pytest.mark.parametrize("cls", HAND_WRITTEN, ids=lambda c: c.__name__)
def test_constructor_takes_every_field_in_order(cls: type) -> None:
    params = list(inspect.signature(cls).parameters)
    assert params == [f.name for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("cls", HAND_WRITTEN, ids=lambda c: c.__name__)
def test_constructor_defaults_are_the_fields(cls: type) -> None:
    signature = inspect.signature(cls).parameters
    for f in dataclasses.fields(cls):
        default = signature[f.name].default
        if f.default is not dataclasses.MISSING:
            assert default == f.default, f.name
        elif f.default_factory is not dataclasses.MISSING:
            assert default is None, f.name  # None: a fresh value from the factory
        else:
            assert default is inspect.Parameter.empty, f.name


def test_built_objects_are_complete_and_frozen() -> None:
    rcpt = Recipient("a@b.example", 7)
    result = DeliveryResult((RecipientResult(rcpt, Outcome.SENT, "2.0.0", "250 ok"),))
    assert result.extra == {} and result.extra is not DeliveryResult(()).extra
    assert result == DeliveryResult(
        (RecipientResult(Recipient("a@b.example", 7), Outcome.SENT, "2.0.0", "250 ok"),)
    )
    for obj in (rcpt, result, result.recipients[0]):
        for f in dataclasses.fields(obj):
            getattr(obj, f.name)  # every slot was set
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, dataclasses.fields(obj)[0].name, None)
