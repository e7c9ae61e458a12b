"""The spool's frozen values with hand-written constructors match their fields.

``RecipientSpec``, ``RecipientRecord`` (``qmgrd.spool.recformat``) and ``LoadedFile``
(``qmgrd.spool.loadread``) set their slots directly in their own ``__init__`` (cheaper than
the generated one): a field added to the class but not to its ``__init__`` would be left
unset. These tests fail then; and ``RecipientSpec`` still checks its NOTIFY keywords.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from qmgrd.errors import InvariantError
from qmgrd.spool.loadread import LoadedFile
from qmgrd.spool.recformat import RecipientRecord, RecipientSpec
from qmgrd.spool.records import QueueFile
from tests.support.frozen import assert_complete_and_frozen, assert_constructor_matches_fields

HAND_WRITTEN = (RecipientSpec, RecipientRecord, LoadedFile)


@pytest.mark.parametrize("cls", HAND_WRITTEN, ids=lambda c: c.__name__)
def test_constructor_takes_every_field_in_order_with_its_default(cls: type) -> None:
    """The constructor's parameters are the dataclass fields, in order, with their defaults
    (none where the field has none; no default factories)."""
    assert_constructor_matches_fields(cls)


def test_built_objects_are_complete_frozen_and_compare_by_value() -> None:
    """Every slot is set, assignment refuses, and ==/hash are the fields'."""
    qf = QueueFile(Path("/q/ABC"), "s@x", 1.0, 1, 100, 10, 80)
    objs = (
        RecipientSpec("a@b.example", "rfc822;a@b.example", frozenset({"SUCCESS"})),
        RecipientRecord("a@b.example", 80),
        LoadedFile(qf, 0o100600, [RecipientRecord("a@b.example", 80)], 0, b"x"),
    )
    for obj in objs:  # only RecipientSpec is hashable (the others hold lists or sets)
        assert_complete_and_frozen(obj, hashable=obj is objs[0])
    assert RecipientSpec("a@b.example") == RecipientSpec(address="a@b.example", notify=frozenset())
    assert RecipientRecord("a@b.example", 80, notify=frozenset({"NEVER"})) != objs[1]


@pytest.mark.parametrize(
    "notify",
    [frozenset({"BOGUS"}), frozenset({"NEVER", "SUCCESS"})],
    ids=["unknown", "never-with-others"],
)
def test_recipient_spec_refuses_bad_notify(notify: frozenset[str]) -> None:
    """The constructor checks NOTIFY as the generated one's ``__post_init__`` did."""
    with pytest.raises(InvariantError):
        RecipientSpec("a@b.example", notify=notify)
    with pytest.raises(InvariantError):
        dataclasses.replace(RecipientSpec("a@b.example"), notify=notify)


def test_the_load_builds_the_queue_file_itself() -> None:
    """``_envelope``'s mutable twin has QueueFile's fields and becomes a real, frozen one."""
    from qmgrd.spool import loadread
    from qmgrd.spool.recformat import Envelope, encode_queue_file

    twin_fields = [f.name for f in dataclasses.fields(loadread._QueueFileTwin)]
    assert twin_fields == [f.name for f in dataclasses.fields(QueueFile)]
    env = Envelope(
        "s@x", (RecipientSpec("a@b.example"),), 1.5, envid="E1", ret="HDRS", warn_time=99
    )
    head, tail = encode_queue_file(env, 3)
    data = head + b"x\r\n" + tail
    qf = loadread._envelope(data, Path("/q/ABC"))
    assert qf is not None and type(qf) is QueueFile
    args = [getattr(qf, name) for name in twin_fields]
    assert qf == QueueFile(*args) and hash(qf) == hash(QueueFile(*args))
    assert repr(qf) == repr(QueueFile(*args))
    with pytest.raises(dataclasses.FrozenInstanceError):
        qf.sender = "other"  # type: ignore[misc]
