"""``fast_init``: the same frozen values as the dataclass's own ``__init__``, made cheaper."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qmgrd.delivery.agent import DeliveryResult, Recipient
from qmgrd.delivery.client import Reply
from qmgrd.delivery.frozen import fast_init


def _value_class(fast: bool) -> type[Any]:
    """The same frozen dataclass, with its own ``__init__`` or with ``fast_init``'s."""

    @dataclass(frozen=True, slots=True)
    class Value:
        a: int
        b: str = "b"
        c: tuple[int, ...] = field(default_factory=tuple)
        seen: list[int] = field(default_factory=list)

        def __post_init__(self) -> None:
            self.seen.append(self.a)

    return fast_init(Value) if fast else Value


Plain = _value_class(fast=False)
Fast = _value_class(fast=True)


@given(st.integers(), st.text(max_size=5) | st.none(), st.booleans())
def test_same_fields_defaults_factories_and_post_init(a: int, b: str | None, keyword: bool) -> None:
    """Positional or keyword, with or without the defaults: the same fields as the dataclass's."""
    args: dict[str, object] = {"a": a} if b is None else {"a": a, "b": b}
    slow = Plain(**args) if keyword else Plain(*args.values())
    fast = Fast(**args) if keyword else Fast(*args.values())
    assert dataclasses.astuple(fast) == dataclasses.astuple(slow)
    assert fast.seen == [a]  # __post_init__ ran once, on a fresh list of its own
    assert Fast(a).seen is not Fast(a).seen


def test_values_stay_frozen_equal_and_hashable() -> None:
    """The delivery values keep what frozen gives them."""
    reply = Reply(250, "2.0.0 Ok")
    with pytest.raises(dataclasses.FrozenInstanceError):
        reply.code = 550  # type: ignore[misc]
    assert reply == Reply(code=250, message="2.0.0 Ok")
    assert hash(Recipient("a@b", 5)) == hash(Recipient("a@b", offset=5, orcpt=None))
    assert repr(reply) == "Reply(code=250, message='2.0.0 Ok')"
    assert DeliveryResult(()).extra == {}
    assert DeliveryResult(()).extra is not DeliveryResult(()).extra
    with pytest.raises(TypeError):
        Reply(250)  # type: ignore[call-arg]


def test_only_frozen_slotted_dataclasses() -> None:
    """A class fast_init cannot make the same is refused when it is defined."""

    @dataclass(slots=True)
    class Mutable:
        a: int

    @dataclass(frozen=True, slots=True)
    class KeywordOnly:
        a: int = field(kw_only=True)

    for cls in (Mutable, KeywordOnly, int):
        with pytest.raises(TypeError):
            fast_init(cls)
