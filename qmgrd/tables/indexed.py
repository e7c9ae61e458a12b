"""Indexed tables ``hash:FILE`` and ``lmdb:FILE``, and the ``postmap`` that builds them.

On-disk format
--------------
``qmgrd postmap FILE`` reads the postmap(1) source ``FILE`` (``key whitespace
value`` lines, ``#`` comments, continuation lines; keys folded to lower case;
a duplicate key keeps the first value with a warning) and writes the index
``FILE.qmgrd.db``: an SQLite 3 database (Python's standard ``sqlite3``) with

- ``map(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID``;
- ``meta(name TEXT PRIMARY KEY, value TEXT)`` holding ``format`` =
  ``qmgrd-postmap-1``, ``source`` (the source path) and ``entries``.

The index is written to a temporary file in the same directory, synced, and
renamed over the old one, so a reader sees the old or the new index, never a
partial one. ``hash:`` and ``lmdb:`` share this format (qmgrd has neither
Berkeley DB nor LMDB); the suffix differs from Postfix's ``FILE.db`` and
``FILE.lmdb`` so that qmgrd and Postfix can share a source file during a
migration without overwriting each other's index.

Lookups open the index read-only, one query per key, and reopen it when the
index file is replaced (its stamp is looked at once per second at most). Opening a table
whose index is missing, foreign or older than its source is a `ConfigError`
saying to run ``qmgrd postmap``; Postfix only warns about an old index, but
silently routing with stale data is what the operator least expects.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import weakref
from pathlib import Path

from qmgrd.errors import ConfigError
from qmgrd.tables.base import file_stamp, log_error, monotonic, recheck_due
from qmgrd.tables.simple import parse_key_value_file

INDEX_SUFFIX = ".qmgrd.db"
FORMAT = "qmgrd-postmap-1"
INDEXED_TYPES = ("hash", "lmdb")


def index_path(source: Path) -> Path:
    """Where the index of ``source`` lives."""
    return source.with_name(source.name + INDEX_SUFFIX)


def postmap(source: Path) -> tuple[int, list[str]]:
    """Build the index of ``source``; returns (entries, duplicate warnings).

    ConfigError naming the file and line for a malformed source, or the
    index file for a write failure. The old index stays if anything fails.
    """
    pairs, warnings = parse_key_value_file(source)
    target = index_path(source)
    tmp: Path | None = None
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        con = sqlite3.connect(tmp)
        try:
            con.execute("PRAGMA journal_mode=OFF")
            con.execute("CREATE TABLE meta(name TEXT PRIMARY KEY, value TEXT)")
            con.execute("CREATE TABLE map(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID")
            con.executemany("INSERT INTO map VALUES (?, ?)", pairs.items())
            con.executemany(
                "INSERT INTO meta VALUES (?, ?)",
                [("format", FORMAT), ("source", str(source)), ("entries", str(len(pairs)))],
            )
            con.commit()
        finally:
            con.close()
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except (OSError, sqlite3.Error) as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise ConfigError(f"{target}: cannot write the index: {exc}") from None
    return len(pairs), warnings


class IndexedTable:
    """``hash:FILE`` / ``lmdb:FILE`` backed by ``FILE.qmgrd.db``."""

    __slots__ = (
        "__weakref__",
        "_checked",
        "_close",
        "_con",
        "_lock",
        "_stamp",
        "index",
        "source",
        "spec",
    )

    def __init__(self, spec: str, source: Path) -> None:
        """Open the index; ConfigError if it is missing, foreign or older than the source."""
        self.spec = spec
        self.source = source
        self.index = index_path(Path(os.path.abspath(source)))  # a URI needs an absolute path
        self._lock = threading.Lock()
        self._stamp = file_stamp(self.index)
        self._con = self._open()
        self._checked = monotonic()
        # A table dropped by a reload closes its connection (Python 3.13 warns about open ones).
        self._close = weakref.finalize(self, self._con.close)

    def _open(self) -> sqlite3.Connection:
        hint = f"run: qmgrd postmap {self.source}"
        if self._stamp is None:
            raise ConfigError(f"{self.spec}: index {self.index} not found ({hint})")
        source_stamp = file_stamp(self.source)
        if source_stamp is not None and source_stamp[0] > self._stamp[0]:
            raise ConfigError(
                f"{self.spec}: index {self.index} is older than source file {self.source} ({hint})"
            )
        try:
            con = sqlite3.connect(
                f"{self.index.as_uri()}?mode=ro", uri=True, check_same_thread=False
            )
            row = con.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
        except sqlite3.Error as exc:
            raise ConfigError(
                f"{self.spec}: {self.index} is not a qmgrd index ({exc}; {hint})"
            ) from None
        if row is None or row[0] != FORMAT:
            con.close()
            raise ConfigError(f"{self.spec}: {self.index} has an unknown format ({hint})")
        return con

    def lookup(self, key: str) -> str | None:
        """The value of ``key`` (case-insensitive); the index is reopened when replaced."""
        with self._lock:
            now = recheck_due(self._checked)
            stamp = self._stamp
            if now is not None:
                self._checked = now
                stamp = file_stamp(self.index)
            if stamp != self._stamp and stamp is not None:
                self._stamp = stamp  # tried once per version of the index file
                try:
                    con = self._open()
                except ConfigError as exc:
                    log_error(f"{exc}; still using the previous index")
                else:
                    self._close()  # closes the old connection once
                    self._con = con
                    self._close = weakref.finalize(self, con.close)
            try:
                row = self._con.execute(
                    "SELECT value FROM map WHERE key = ?", (key.lower(),)
                ).fetchone()
            except sqlite3.Error as exc:  # a damaged index: logged, treated as not found
                log_error(f"{self.spec}: lookup failed: {exc}")
                return None
        return None if row is None else str(row[0])
