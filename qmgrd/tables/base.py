"""What every lookup table shares: the protocol, the source-file watcher, the line reader.

Contract
--------
- `LookupTable` is the one interface callers see: ``spec`` (as written) and
  ``lookup(key) -> str | None``. Lookups never raise for a configuration
  reason: a table is parsed completely when it is opened (`ConfigError`
  naming the file and the line), and again when its file changes.
- `Watched` re-reads a table's file when it changes (mtime, size or inode),
  looking at most once per `RECHECK_INTERVAL` seconds (one ``stat``; a lookup
  costs a clock read otherwise), so an edit is seen within a second. A changed file that no longer
  parses, or that disappeared, keeps the previous contents in use and logs
  one error per change, as a running daemon must not lose its routing because
  of an editor's half-saved file; a reload (SIGHUP) then reports the error
  and is refused.
- `table_lines` splits a table file into logical lines with Postfix's rules
  (readlline.c, shared with main.cf): ``#`` comments, blank lines, and lines
  that start with whitespace continuing the previous one. Each logical line
  carries the number of its first physical line, for error messages.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, Protocol, TypeVar, runtime_checkable

from qmgrd.config.files import logical_lines
from qmgrd.errors import ConfigError


@runtime_checkable
class LookupTable(Protocol):
    """A Postfix-style lookup table (``type:name``)."""

    spec: str  # as written, e.g. "texthash:/etc/qmgrd/sasl_passwd"

    def lookup(self, key: str) -> str | None:
        """The value for exactly ``key``; None if absent.

        Keys are case-insensitive except for regexp/pcre tables (whose
        patterns decide, case-insensitive by default as in Postfix).
        """
        ...


def resolve_path(name: str, base_dir: Path) -> Path:
    """A table file name; a relative one is relative to ``base_dir`` (the config directory)."""
    path = Path(name)
    return path if path.is_absolute() else base_dir / path


def table_lines(text: str, where: str) -> Iterator[tuple[int, str]]:
    """Yield (first physical line number, joined logical line) of a table file.

    ``where`` names the file for the error about a leading continuation line.
    """
    return logical_lines(
        text, where, leading_error="continuation line without a preceding entry"
    )


def read_table_file(path: Path) -> str:
    """The file's text, or a ConfigError naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: table file not found") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """(mtime_ns, size, inode) of ``path``, or None if it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


T = TypeVar("T")

RECHECK_INTERVAL = 1.0
"""Seconds between two looks at a table file's stamp (read at each check, so tests can set 0)."""


def monotonic() -> float:
    """The clock the recheck interval is measured with (tests replace it)."""
    return time.monotonic()


def recheck_due(last: float) -> float | None:
    """The current monotonic time if a table should look at its file again, else None."""
    now = monotonic()
    return now if now - last >= RECHECK_INTERVAL else None


class Watched(Generic[T]):
    """Parsed contents of one file, re-parsed when the file changes.

    ``load(path)`` parses the file (raising ConfigError); it runs once in the
    constructor (errors propagate: the table cannot be opened) and again from
    `current` whenever the file's stamp differs from the last one seen.
    """

    __slots__ = ("_checked", "_data", "_load", "_lock", "_reported", "_stamp", "path")

    def __init__(self, path: Path, load: Callable[[Path], T]) -> None:
        """Load ``path`` now; ConfigError if it cannot be read or parsed."""
        self.path = path
        self._load = load
        self._lock = threading.Lock()
        self._stamp = file_stamp(path)
        self._data = load(path)
        self._reported: tuple[int, int, int] | None = (-1, -1, -1)  # last broken version
        self._checked = monotonic()

    def current(self) -> T:
        """The contents, re-read first if the file changed since the last look."""
        now = recheck_due(self._checked)
        if now is None:
            return self._data
        self._checked = now
        stamp = file_stamp(self.path)
        if stamp == self._stamp or stamp == self._reported:
            return self._data  # unchanged, or the same broken version already reported
        with self._lock:
            if stamp == self._stamp or stamp == self._reported:
                return self._data
            try:
                if stamp is None:
                    raise ConfigError(f"{self.path}: table file not found")
                data = self._load(self.path)
            except ConfigError as exc:
                self._reported = stamp
                log_error(f"{exc}; still using the previous contents")
                return self._data
            self._data, self._stamp = data, stamp
            return data


def log_error(text: str) -> None:
    """Log a table problem found while the daemon runs (component ``dict``, as Postfix)."""
    from qmgrd.log import get_logger  # deferred: tables are usable without logging set up

    get_logger("dict").error(text)


def log_warnings(warnings: list[str]) -> None:
    """Log each warning of a table just (re)read, e.g. duplicate keys."""
    if not warnings:
        return
    from qmgrd.log import get_logger

    log = get_logger("dict")
    for text in warnings:
        log.warning(text)
