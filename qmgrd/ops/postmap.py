"""``qmgrd postmap``: build indexed lookup tables, or query any table (Postfix's postmap(1)).

- ``qmgrd postmap FILE ...`` / ``qmgrd postmap hash:FILE`` / ``lmdb:FILE``:
  build ``FILE.qmgrd.db`` from the source (format in `qmgrd.tables.indexed`);
  duplicate keys are warnings, a malformed line is an error naming the file
  and the line, and the previous index stays in place.
- ``qmgrd postmap -q KEY TYPE:NAME``: print the value of exactly KEY in that
  table (any type qmgrd has); exit 1 if KEY is absent, as postmap does.

Relative file names are relative to the current directory, as for postmap.
Exit 0, 1 on an error (``qmgrd: fatal: ...``) or a key not found.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from qmgrd.errors import ConfigError
from qmgrd.tables import open_table, postmap
from qmgrd.tables.indexed import INDEXED_TYPES


def _source(arg: str) -> Path:
    kind, sep, name = arg.partition(":")
    if not sep or "/" in kind:
        return Path(arg)
    if kind not in INDEXED_TYPES:
        raise ConfigError(
            f"{arg}: postmap builds {' and '.join(INDEXED_TYPES)} tables only "
            f"({kind} tables are read from their source file directly)"
        )
    return Path(name)


def postmap_command(files: list[str], *, query: str | None, out: TextIO, err: TextIO) -> int:
    """Build the indexes of ``files``, or look ``query`` up in the one table given."""
    try:
        if query is not None:
            if len(files) != 1:
                raise ConfigError("-q KEY needs exactly one table (type:name)")
            spec = files[0] if ":" in files[0] else f"hash:{files[0]}"
            value = open_table(spec, base_dir=Path.cwd()).lookup(query)
            if value is None:
                return 1
            print(value, file=out)
            return 0
        for arg in files:
            _count, warnings = postmap(_source(arg))
            for warning in warnings:
                print(f"qmgrd: warning: {warning}", file=err)
    except ConfigError as exc:
        print(f"qmgrd: fatal: {exc}", file=err)
        return 1
    return 0
