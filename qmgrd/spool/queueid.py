"""Queue ids: unique, time-ordered, safe as file names (DESIGN §3).

An id is 15 characters of a 32-symbol alphabet whose ASCII order equals its
numeric order, so sorting ids sorts messages by arrival:

- 11 symbols: the creation time in microseconds since the epoch (55 bits,
  good until the year 3110);
- 4 symbols: a 20-bit salt drawn at random when the generator is created.

One generator never repeats a microsecond: when the clock has not advanced
(or went backwards) since the last id, it uses the last microsecond plus one.
So ids from one process are strictly increasing, and two processes (a daemon
restart within the same microsecond, or the daemon and a CLI tool) differ in
their salt. The spool's commit refuses to overwrite an existing file, so even
a salt collision cannot replace a queued message.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base 32: ASCII order == value order
_TIME_DIGITS = 11
_SALT_DIGITS = 4
QUEUE_ID_LENGTH = _TIME_DIGITS + _SALT_DIGITS
_VALID = frozenset(ALPHABET)


def _encode(value: int, width: int) -> str:
    out = []
    for _ in range(width):
        value, digit = divmod(value, 32)
        out.append(ALPHABET[digit])
    return "".join(reversed(out))


def is_queue_id(name: str) -> bool:
    """Whether ``name`` looks like a queue id (scans use it to skip stray files)."""
    return len(name) == QUEUE_ID_LENGTH and all(ch in _VALID for ch in name)


def queue_id_time(queue_id: str) -> float:
    """The creation time (seconds since the epoch) encoded in a queue id."""
    value = 0
    for ch in queue_id[:_TIME_DIGITS]:
        value = value * 32 + ALPHABET.index(ch)
    return value / 1e6


class QueueIdGenerator:
    """Hands out strictly increasing queue ids for one process.

    ``clock_ns`` is injectable so tests can freeze or rewind time.
    """

    __slots__ = ("_clock_ns", "_last_us", "_salt")

    def __init__(self, clock_ns: Callable[[], int] = time.time_ns, salt: int | None = None) -> None:
        self._clock_ns = clock_ns
        self._last_us = 0
        self._salt = _encode(secrets.randbits(20) if salt is None else salt, _SALT_DIGITS)

    def next(self) -> str:
        """A new id, strictly greater than every id this generator returned before."""
        now_us = self._clock_ns() // 1000
        if now_us <= self._last_us:
            now_us = self._last_us + 1
        self._last_us = now_us
        return _encode(now_us, _TIME_DIGITS) + self._salt


def new_queue_id() -> str:
    """A fresh id from a throw-away generator (random salt): for one-off writers."""
    return QueueIdGenerator().next()
