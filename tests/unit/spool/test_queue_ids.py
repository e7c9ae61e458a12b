"""Queue ids: Postfix's short and long formats, the legacy format still read, order, no clash."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from qmgrd.spool import Envelope, QueueIdGenerator, RecipientSpec, Spool, is_queue_id
from qmgrd.spool.queueid import (
    new_queue_id,
    queue_id_slot,
    queue_id_sort_key,
    queue_id_time,
    sort_queue_ids,
)

# pymailq's PostqueueStore.mail_id_re: the tool that crashed on qmgrd's old ids.
PYMAILQ_ID = re.compile(r"^[A-F0-9]{8,12}[*!]?$")
# Postfix's safe_ultostr alphabet, written out here independently of the module.
POSTFIX_SAFE = "0123456789BCDFGHJKLMNPQRSTVWXYZbcdfghjklmnpqrstvwxyz"
_SAFE = "0-9B-DF-HJ-NP-TV-Zb-df-hj-np-tv-"
LONG_ID = re.compile(rf"^[{_SAFE}z]{{10}}z[{_SAFE}y]+$")
ENV = Envelope("s@example.com", (RecipientSpec("r@example.com"),), 1_700_000_000.0)
NOW_NS = 1_763_900_000_123_456_000  # 2025-11-23, µs 123456


def _postfix_b52(text: str) -> int:
    value = 0
    for ch in text:
        value = value * 52 + POSTFIX_SAFE.index(ch)
    return value


def _legacy_id(time_us: int, salt: int) -> str:
    """An id as qmgrd wrote them before Postfix's formats (Crockford base 32, 11 + 4)."""
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    digits = []
    value = time_us * (32**4) + salt
    for _ in range(15):
        value, d = divmod(value, 32)
        digits.append(alphabet[d])
    return "".join(reversed(digits))


def test_short_ids_are_postfix_hex_microseconds_then_a_hex_field() -> None:
    """The default format is %05X of the microseconds then 7 hex digits, as pymailq expects."""
    qid = QueueIdGenerator(lambda: NOW_NS).next()
    assert qid[:5] == "1E240"  # 123456 microseconds
    assert qid[5:] == f"{(NOW_NS // 10**9) % 2**28:07X}"
    assert PYMAILQ_ID.match(qid) and PYMAILQ_ID.match(qid + "*") and PYMAILQ_ID.match(qid + "!")
    assert is_queue_id(qid)
    assert queue_id_time(qid, now=NOW_NS / 1e9) == NOW_NS // 1000 / 1e6


def test_long_ids_are_postfix_base52_seconds_microseconds_z_and_salt() -> None:
    """enable_long_queue_ids gives MQID_LG: base-52 seconds (6), microseconds (4), 'z', base 51."""
    qid = QueueIdGenerator(lambda: NOW_NS, salt=12345, long_ids=True).next()
    assert LONG_ID.match(qid), qid
    assert _postfix_b52(qid[:6]) == NOW_NS // 10**9
    assert _postfix_b52(qid[6:10]) == 123456
    assert qid[10] == "z" and "z" not in qid[11:]
    assert is_queue_id(qid)
    assert queue_id_time(qid) == NOW_NS // 1000 / 1e6


def test_long_ids_sort_as_strings_in_creation_order_across_seconds() -> None:
    """Long ids keep string order == creation order (fixed widths, ASCII-ordered alphabet)."""
    times = iter(range(NOW_NS, NOW_NS + 3_000_000_000, 7_919_000))
    gen = QueueIdGenerator(lambda: next(times), long_ids=True)
    ids = [gen.next() for _ in range(300)]
    assert ids == sorted(ids)


def test_short_ids_sort_by_creation_not_by_string() -> None:
    """Across a second boundary short ids are out of string order; sort_queue_ids fixes it."""
    whole = NOW_NS - 123_456_000  # a whole second
    times = iter([whole + 900_000_000, whole + 1_100_000_000])
    gen = QueueIdGenerator(lambda: next(times))
    first, second = gen.next(), gen.next()
    assert sorted([first, second]) == [second, first]
    assert sort_queue_ids([second, first], now=NOW_NS / 1e9) == [first, second]


def test_short_id_time_is_resolved_near_now_across_the_wrap() -> None:
    """The 28-bit second field is read as the latest matching second up to a day after now."""
    qid = QueueIdGenerator(lambda: NOW_NS).next()
    created = NOW_NS // 1000 / 1e6
    assert queue_id_time(qid, now=created + 200 * 86400) == created  # queued 200 days
    assert queue_id_time(qid, now=created - 3600) == created  # this clock is an hour behind
    wrap = 2**28
    later = queue_id_time(qid, now=created + wrap + 10)  # 8.5 years later: a new id
    assert later == pytest.approx(created + wrap, abs=1e-6)


def test_legacy_ids_of_an_existing_spool_are_still_queue_ids_in_order() -> None:
    """Ids written before the upgrade are accepted, dated, and sorted among new ones."""
    old = _legacy_id(NOW_NS // 1000 - 5_000_000, 77)  # five seconds before
    new_short = QueueIdGenerator(lambda: NOW_NS).next()
    new_long = QueueIdGenerator(lambda: NOW_NS + 1000, long_ids=True).next()
    assert is_queue_id(old)
    assert queue_id_time(old) == (NOW_NS // 1000 - 5_000_000) / 1e6
    now = NOW_NS / 1e9
    assert sort_queue_ids([new_long, new_short, old], now=now) == [old, new_short, new_long]


@given(st.integers(min_value=0, max_value=2**62), st.integers(min_value=0, max_value=2**20 - 1))
def test_the_three_formats_never_collide(time_ns: int, salt: int) -> None:
    """A short, a long and a legacy id for any instant and salt are three different names."""
    short = QueueIdGenerator(lambda: time_ns).next()
    long = QueueIdGenerator(lambda: time_ns, salt=salt, long_ids=True).next()
    legacy = _legacy_id(time_ns // 1000, salt)
    assert len({short, long, legacy}) == 3
    assert len(short) == 12 and re.fullmatch("[0-9A-F]+", short)
    assert "z" in long and not re.fullmatch("[0-9A-Z]+", long)
    assert len(legacy) == 15 and re.fullmatch("[0-9A-Z]+", legacy)
    assert all(is_queue_id(i) for i in (short, long, legacy))


def test_stray_names_are_not_queue_ids() -> None:
    """Near misses of each format are refused (scans skip them)."""
    good_short = QueueIdGenerator(lambda: NOW_NS).next()
    good_long = QueueIdGenerator(lambda: NOW_NS, long_ids=True).next()
    for name in [
        "F4240" + good_short[5:],  # 1,000,000 microseconds
        good_short.lower(),
        good_short[:-1],
        good_long[:10] + "y" + good_long[11:],  # no separator
        good_long[:11] + "z" + good_long[12:],  # 'z' in the base-51 part
        "README",
        "",
        ".ABCDEF123456",
    ]:
        assert not is_queue_id(name), name


def test_one_generator_is_unique_across_threads_with_a_frozen_clock() -> None:
    """Writer threads sharing the spool's generator never get the same id."""
    gen = QueueIdGenerator(lambda: NOW_NS)
    out: list[list[str]] = [[] for _ in range(4)]

    def work(bucket: list[str]) -> None:
        bucket.extend(gen.next() for _ in range(2000))

    threads = [threading.Thread(target=work, args=(b,)) for b in out]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    ids = [i for bucket in out for i in bucket]
    assert len(ids) == 8000 and len(set(ids)) == 8000


def test_new_queue_id_gives_distinct_valid_ids() -> None:
    """One-off ids (tests, tools) are valid and do not repeat in a tight loop."""
    ids = [new_queue_id() for _ in range(2000)] + [new_queue_id(long_ids=True) for _ in range(50)]
    assert all(is_queue_id(i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_spool_scans_list_mixed_formats_oldest_first(tmp_path: Path) -> None:
    """list_ids orders legacy, short and long ids by creation time, not by name."""
    spool = Spool(tmp_path / "spool", fsync=False)
    spool.ensure_dirs()
    base = (time.time_ns() // 10**9 - 60) * 10**9  # a whole second a minute ago
    legacy = _legacy_id(base // 1000 - 10_000_000, 3)
    spool.path("incoming", legacy).write_bytes(b"")
    times = iter([base + 900_000_000, base + 1_100_000_000])
    short = Spool(spool.root, fsync=False, ids=QueueIdGenerator(lambda: next(times)))
    a, b = short.commit(ENV, b"a"), short.commit(ENV, b"b")
    late = Spool(
        spool.root,
        fsync=False,
        ids=QueueIdGenerator(lambda: base + 2_000_000_000, long_ids=True),
    ).commit(ENV, b"c")
    assert sorted([a, b]) == [b, a]
    assert spool.list_ids("incoming") == [legacy, a, b, late]


def test_qshape_ages_mail_of_every_id_format_by_its_arrival(tmp_path: Path) -> None:
    """qshape counts legacy-, short- and long-id mail alike, aged by arrival time."""
    from qmgrd.ops.qshape import compute_shape
    from qmgrd.spool.records import encode_queue_file

    spool = Spool(tmp_path / "spool", fsync=False)
    spool.ensure_dirs()
    arrival = 1_700_000_000.0
    old_env = Envelope("s@example.com", (RecipientSpec("r@old.example"),), arrival - 3600)
    head, tail = encode_queue_file(old_env, 1)
    legacy = _legacy_id(int((arrival - 3600) * 1e6), 5)
    spool.path("incoming", legacy).write_bytes(head + b"x" + tail)
    new_env = Envelope("s@example.com", (RecipientSpec("r@new.example"),), arrival)
    spool.commit(new_env, b"x")
    Spool(spool.root, fsync=False, ids=QueueIdGenerator(long_ids=True)).commit(new_env, b"x")
    shape = compute_shape(spool, ["incoming"], by_sender=False, now=arrival + 60)
    rows = dict(shape.rows)
    assert rows["new.example"][0] == 2  # younger than 5 minutes
    assert rows["old.example"][4] == 1  # 61 minutes: the 40-80 bucket


@given(st.integers(min_value=10**9, max_value=2**62), st.integers(min_value=0, max_value=2**20 - 1))
@example(4463010944362063000, 0)  # a float of seconds one microsecond off (found by hypothesis)
def test_the_fast_sort_key_agrees_with_queue_id_time(time_ns: int, salt: int) -> None:
    """The scans' sort key gives every format the same time as the validating decoder."""
    now = time_ns / 1e9
    key = queue_id_sort_key(now)
    for qid in (
        QueueIdGenerator(lambda: time_ns).next(),
        QueueIdGenerator(lambda: time_ns, salt=salt, long_ids=True).next(),
        _legacy_id(time_ns // 1000, salt),
    ):
        # The validating decoder returns float seconds: from 2^32 s (the year 2106) a float's
        # step is about 1 microsecond, so it may differ by one there; the key is exact.
        assert key(qid)[1] == qid
        assert abs(key(qid)[0] - round(queue_id_time(qid, now=now) * 1e6)) <= 1
        assert key(qid)[0] == time_ns // 1000


@given(st.integers(min_value=10**15, max_value=2 * 10**18), st.integers(min_value=1, max_value=8))
def test_slots_never_draw_the_same_id_across_processes(time_ns: int, slots: int) -> None:
    """Generators of different slots (the daemon and its listener workers), reading the same
    frozen clock, never produce the same short or long id, each stays in order, and the
    slot can be read back from the id."""
    for long_ids in (False, True):
        seen: set[str] = set()
        for slot in range(slots):
            gen = QueueIdGenerator(
                lambda: time_ns, salt=0, long_ids=long_ids, slot=slot, slots=slots
            )
            ids = [gen.next() for _ in range(5)]
            assert sort_queue_ids(ids, now=time_ns / 1e9) == ids
            assert not seen & set(ids)
            assert {queue_id_slot(i, slots, time_ns / 1e9) for i in ids} == {slot}
            seen |= set(ids)


def test_a_slot_outside_its_range_is_refused() -> None:
    """slot must be one of slots."""
    with pytest.raises(ValueError, match="slot 2"):
        QueueIdGenerator(slot=2, slots=2)
