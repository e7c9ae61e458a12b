"""Queue ids: unique among queued messages, safe as file names, in Postfix's two formats.

``enable_long_queue_ids`` chooses the format of new ids (Postfix's parameter,
default ``no``). Every reader accepts all three formats below, so a spool
keeps working across an upgrade or a change of the parameter, and the three
never collide (they differ in length or alphabet).

Short ids (``enable_long_queue_ids = no``, Postfix's ``MQID_SH_*``)::

    4A0C1 922FA60      12 characters of upper-case hex, e.g. "4A0C1922FA60"
    usec  second

- 5 hex digits: the microseconds of the creation time (``%05X``, < F4240);
- 7 hex digits: where Postfix writes the queue file's inode number (``%lX``),
  qmgrd writes the creation second modulo 2**28 (``%07X``; 8.5 years).

  Why not the inode: Postfix creates the file first and names it after its
  inode, so the file itself reserves the id while the message is queued.
  qmgrd names a queue file before creating it (the writer's temporary is
  ``incoming/.<id>``), so the id cannot come from the inode. Instead the two
  fields together are the creation time in microseconds modulo 8.5 years, and
  one generator never repeats a microsecond (see below): the same guarantee,
  "no two queued messages have the same id", for as long as no message stays
  queued 8.5 years, and only one writer per spool exists (the daemon, which
  holds the spool lock; the CLI tools never create queue files). As with
  Postfix's short ids, string order is not arrival order and an id can be
  reused after it is gone: sort with ``sort_queue_ids``, never ``sorted``.
  Tools that expect Postfix's ids (pymailq: ``^[A-F0-9]{8,12}[*!]?$``, the
  usual ``[0-9A-F]+`` of log parsers) accept them.

Long ids (``enable_long_queue_ids = yes``, Postfix's ``MQID_LG_*``)::

    4dDnsr 288d z 0vRh      15 characters, e.g. "4dDnsr288dz0vRh"
    second usec   salt

- the seconds in base 52 (at least 6 characters: until the year 2596) and the
  microseconds in base 52 (exactly 4), with Postfix's "safe" alphabet
  ``0-9``, consonants in upper then lower case (no vowels, so no words); its
  ASCII order is its value order, so string order is creation order;
- ``z``, the separator (Postfix's ``MQID_LG_INUM_SEP``);
- where Postfix writes the inode in base 51 (no ``z``), a 20-bit salt drawn
  when the generator is created (4 characters): two processes that create an
  id in the same microsecond differ in it. Never reused.

Legacy ids (written by qmgrd before this module knew Postfix's formats, still
read): 15 characters of Crockford base 32 (upper case), 11 for the time in
microseconds and 4 for a salt; string order is creation order.

Generators: ``QueueIdGenerator(long_ids=...)``. ``next()`` reads the clock
once, and if the clock has not advanced (or went back) since its last id it
uses the last microsecond plus one, so ids from one generator are unique and
in creation order; it is thread-safe (the listener's writers call it from
worker threads). The spool's commit also links a queue file under its id
with ``link()``, which never replaces an existing file.

``queue_id_time(id, now)`` returns the creation time of any id; for a short
id the second is taken as the latest one congruent with it that is not more
than a day after ``now`` (clocks skew). ``sort_queue_ids(ids)`` orders ids
of any mix of formats by creation time (ties by the id).
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable

__all__ = [
    "LEGACY_ALPHABET",
    "SAFE_ALPHABET",
    "QueueIdGenerator",
    "is_queue_id",
    "new_queue_id",
    "queue_id_slot",
    "queue_id_sort_key",
    "queue_id_time",
    "sort_queue_ids",
]

_US = 1_000_000

# --- short (Postfix MQID_SH): %05X microseconds + hex second modulo 2**28 ------------
_SH_USEC_DIGITS = 5
_SH_SEC_DIGITS = 7
_SH_SEC_MOD = 1 << (4 * _SH_SEC_DIGITS)
_SH_LENGTH = _SH_USEC_DIGITS + _SH_SEC_DIGITS
_SKEW = 86400  # a short id up to a day "in the future" is taken as from now, not 8.5 years ago

# --- long (Postfix MQID_LG): base-52 seconds and microseconds, 'z', base-51 salt --------
SAFE_ALPHABET = "0123456789BCDFGHJKLMNPQRSTVWXYZbcdfghjklmnpqrstvwxyz"  # Postfix's safe_ultostr
_LG_SEC_DIGITS = 6
_LG_USEC_DIGITS = 4
_LG_SEP = "z"
_LG_SALT_DIGITS = 4
_LG_LENGTH = _LG_SEC_DIGITS + _LG_USEC_DIGITS + 1 + _LG_SALT_DIGITS

# --- legacy: Crockford base 32, 11 digits of microseconds + 4 of salt ----------------
LEGACY_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_LEGACY_TIME_DIGITS = 11
_LEGACY_LENGTH = 15

_SALT_BITS = 20


def _encode(value: int, alphabet: str, width: int) -> str:
    """``value`` in base ``len(alphabet)``, left-padded with the zero digit to ``width``."""
    base = len(alphabet)
    out: list[str] = []
    while value or len(out) < width:
        value, digit = divmod(value, base)
        out.append(alphabet[digit])
    return "".join(reversed(out))


_SHORT_RE = re.compile(r"[0-9A-F]{12}")
_SAFE_CLASS = "0-9B-DF-HJ-NP-TV-Zb-df-hj-np-t"  # SAFE_ALPHABET without v-z
_LONG_RE = re.compile(rf"[{_SAFE_CLASS}v-z]{{10}}z[{_SAFE_CLASS}v-y]{{4}}")
_LEGACY_RE = re.compile(r"[0-9A-HJKMNP-TV-Z]{15}")
# Crockford symbols -> the digits int(..., 32) reads, so legacy ids decode in C.
_LEGACY_TO_B32 = str.maketrans(LEGACY_ALPHABET, "0123456789abcdefghijklmnopqrstuv")
# Every pair of base-52 symbols -> its value: a long id's 10 time symbols in 5 look-ups.
_PAIR_VALUE = {
    a + b: i * 52 + j for i, a in enumerate(SAFE_ALPHABET) for j, b in enumerate(SAFE_ALPHABET)
}


def _is_short(name: str) -> bool:
    return _SHORT_RE.fullmatch(name) is not None and int(name[:_SH_USEC_DIGITS], 16) < _US


def _is_long(name: str) -> bool:
    return _LONG_RE.fullmatch(name) is not None and _long_usec(name) < _US


def _is_legacy(name: str) -> bool:
    return _LEGACY_RE.fullmatch(name) is not None


def _long_second(name: str) -> int:
    p = _PAIR_VALUE
    return (p[name[0:2]] * 2704 + p[name[2:4]]) * 2704 + p[name[4:6]]


def _long_usec(name: str) -> int:
    return _PAIR_VALUE[name[6:8]] * 2704 + _PAIR_VALUE[name[8:10]]


def is_queue_id(name: str) -> bool:
    """Whether ``name`` is a queue id of any format (scans use it to skip stray files)."""
    return _is_short(name) or _is_long(name) or _is_legacy(name)


def _time_us(queue_id: str, now: float) -> int:
    """The creation time of ``queue_id`` in microseconds since the epoch."""
    if _is_short(queue_id):
        return _short_time_us(queue_id, int(now) + _SKEW)
    if _is_long(queue_id):
        return _long_second(queue_id) * _US + _long_usec(queue_id)
    if _is_legacy(queue_id):
        return int(queue_id[:_LEGACY_TIME_DIGITS].translate(_LEGACY_TO_B32), 32)
    raise ValueError(f"not a queue id: {queue_id!r}")


def _short_time_us(queue_id: str, latest: int) -> int:
    """A short id's time, its second being the latest congruent one <= ``latest``."""
    second = int(queue_id[_SH_USEC_DIGITS:], 16)
    second = latest - (latest - second) % _SH_SEC_MOD
    return second * _US + int(queue_id[:_SH_USEC_DIGITS], 16)


def queue_id_time(queue_id: str, now: float | None = None) -> float:
    """The creation time (seconds since the epoch) of an id; ValueError if it is none.

    ``now`` (default: the clock) only matters for short ids (module doc).
    """
    return _time_us(queue_id, time.time() if now is None else now) / _US


def queue_id_slot(queue_id: str, slots: int, now: float) -> int:
    """Which ``QueueIdGenerator`` slot of ``slots`` drew ``queue_id`` (ValueError if no id).

    Exact for an id drawn within 8.5 years before ``now`` (short ids; long ids always).
    """
    return _time_us(queue_id, now) % slots


def queue_id_sort_key(now: float) -> Callable[[str], tuple[int, str]]:
    """A sort key: creation time, then the id (short ids resolved against ``now``).

    For ids that passed ``is_queue_id`` (scans): it tells the formats apart
    by length and separator only, to sort a large queue quickly.
    """
    latest = int(now) + _SKEW

    def key(queue_id: str) -> tuple[int, str]:
        size = len(queue_id)
        if size == _SH_LENGTH:
            return _short_time_us(queue_id, latest), queue_id
        if size == _LG_LENGTH and queue_id[_LG_SEC_DIGITS + _LG_USEC_DIGITS] == _LG_SEP:
            return _long_second(queue_id) * _US + _long_usec(queue_id), queue_id
        if size == _LEGACY_LENGTH:
            legacy = queue_id[:_LEGACY_TIME_DIGITS].translate(_LEGACY_TO_B32)
            return int(legacy, 32), queue_id
        raise ValueError(f"not a queue id: {queue_id!r}")

    return key


def sort_queue_ids(ids: Iterable[str], now: float | None = None) -> list[str]:
    """Ids of any formats in creation order (oldest first); reads the clock once."""
    return sorted(ids, key=queue_id_sort_key(time.time() if now is None else now))


class QueueIdGenerator:
    """Hands out unique ids in creation order for one process (see the module doc).

    ``long_ids`` is ``enable_long_queue_ids``; ``clock_ns`` is injectable so
    tests can freeze or rewind time; ``salt`` (long ids only) defaults to 20
    random bits. ``slot`` of ``slots``: when several processes write one
    spool (the daemon and its listener workers), each has its own slot and
    draws only microseconds congruent to it modulo ``slots``, so no two
    processes can ever draw the same id.
    """

    __slots__ = ("_clock_ns", "_last_us", "_lock", "_long", "_salt", "_slot", "_slots")

    def __init__(
        self,
        clock_ns: Callable[[], int] = time.time_ns,
        salt: int | None = None,
        *,
        long_ids: bool = False,
        slot: int = 0,
        slots: int = 1,
    ) -> None:
        if not 0 <= slot < slots:
            raise ValueError(f"queue id slot {slot} is not one of {slots}")
        self._slot = slot
        self._slots = slots
        if salt is not None and not 0 <= salt < 1 << _SALT_BITS:
            raise ValueError(f"salt {salt} is not a {_SALT_BITS}-bit number")
        self._clock_ns = clock_ns
        self._last_us = 0
        self._lock = threading.Lock()
        self._long = long_ids
        value = secrets.randbits(_SALT_BITS) if salt is None else salt
        self._salt = _encode(value, SAFE_ALPHABET[:51], _LG_SALT_DIGITS)

    @property
    def long_ids(self) -> bool:
        return self._long

    def next(self) -> str:
        """A new id, later in creation order than every id this generator returned."""
        with self._lock:
            now_us = self._clock_ns() // 1000
            if now_us <= self._last_us:
                now_us = self._last_us + 1
            now_us += (self._slot - now_us) % self._slots
            self._last_us = now_us
        second, usec = divmod(now_us, _US)
        if self._long:
            return (
                _encode(second, SAFE_ALPHABET, _LG_SEC_DIGITS)
                + _encode(usec, SAFE_ALPHABET, _LG_USEC_DIGITS)
                + _LG_SEP
                + self._salt
            )
        return f"{usec:05X}{second % _SH_SEC_MOD:07X}"


def new_queue_id(*, long_ids: bool = False) -> str:
    """A fresh id for one-off use (tests, tools): now, with a random second field if short.

    A throw-away generator has no history, so two calls in the same
    microsecond would give the same short id; the random field makes that
    unlikely (2**-28). Such ids do not encode their time: never use this for
    queue files the daemon writes.
    """
    if long_ids:
        return QueueIdGenerator(long_ids=True).next()
    usec = (time.time_ns() // 1000) % _US
    return f"{usec:05X}{secrets.randbits(4 * _SH_SEC_DIGITS):07X}"
