"""The spool's free space at MAIL: one ``statfs`` per interval while there is plenty of it.

MAIL asks ``SpoolRoom.has_room(need)`` (``need``: ``queue_minfree``, at least
64 KiB, plus the SIZE the client declared; ``qmgrd.listener.transaction``).
The file system is asked again (``os.statvfs``) unless the last answer is
younger than ``REFRESH`` seconds and showed at least ``need + MARGIN`` bytes
free. So a spool with plenty of room costs one system call per ``REFRESH``
instead of one per MAIL, and a spool short of space (less than ``MARGIN``
above the need) is asked at every MAIL, as before: ``queue_minfree`` is
honoured, and a file system that fills up is seen at the next MAIL. What
other writers consume within ``REFRESH`` while more than ``MARGIN`` was free
is the only thing a cached answer can miss; the commit then fails with
``451 4.3.0`` and leaves nothing, as it would if the space went after MAIL.

One per process (``ListenerContext.room``); ``clock`` is a monotonic clock
(seconds), only ever used to age the answer.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

REFRESH = 0.1  # seconds a plentiful answer is reused
MARGIN = 64 * 1024 * 1024  # bytes above the need for an answer to be reused


class SpoolRoom:
    """The free space of the spool's file system, asked at most once per ``REFRESH``."""

    __slots__ = ("_at", "_clock", "_free", "root")

    def __init__(self, root: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root
        self._clock = clock
        self._free = 0  # bytes free at the last answer
        self._at = -math.inf  # when it was given

    def has_room(self, need: int) -> bool:
        """Whether ``need`` bytes are free now (module doc); True when it cannot tell."""
        now = self._clock()
        if now - self._at < REFRESH and self._free >= need + MARGIN:
            return True
        try:
            st = os.statvfs(self.root)
        except OSError:
            self._at = -math.inf
            return True  # cannot tell: let the commit decide (451 if it fails)
        self._free = st.f_bavail * st.f_frsize
        self._at = now
        return self._free >= need
