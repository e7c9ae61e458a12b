"""Postfix-style lookup tables: ``open_table("type:name", base_dir=...)``.

Public API::

    table = open_table("hash:/etc/qmgrd/transport", base_dir=Path("/etc/qmgrd"))
    table.lookup("example.com")            # str | None; ConfigError only at open
    find_address([table], "u+x@a.example", Order.TRANSPORT, recipient_delimiter="+")

Types: ``inline:{k=v, ...}``, ``texthash:FILE``, ``hash:FILE`` and ``lmdb:FILE``
(index built by ``qmgrd postmap FILE``, see `qmgrd.tables.indexed`),
``regexp:`` and ``pcre:`` (FILE or ``{ {rule}, ... }``, see
`qmgrd.tables.regexp`), ``cidr:`` (same, `qmgrd.tables.cidr`) and
``static:value``. A relative FILE is relative to ``base_dir``. Files are
re-read (indexes reopened) when they change. Any other type, a missing file,
a malformed line or a pattern that does not compile is a `ConfigError`
naming the table, the file and the line.
"""

from __future__ import annotations

from pathlib import Path

from qmgrd.errors import ConfigError
from qmgrd.tables.base import LookupTable, resolve_path
from qmgrd.tables.cidr import CidrTable
from qmgrd.tables.indexed import INDEXED_TYPES, IndexedTable, index_path, postmap
from qmgrd.tables.order import (
    Order,
    address_keys,
    domain_keys,
    find_address,
    find_domain,
    is_pattern_table,
    strip_extension,
)
from qmgrd.tables.regexp import RegexpTable
from qmgrd.tables.simple import InlineTable, StaticTable, TextHashTable, inline_rules

__all__ = [
    "TABLE_TYPES",
    "LookupTable",
    "Order",
    "address_keys",
    "domain_keys",
    "find_address",
    "find_domain",
    "index_path",
    "is_pattern_table",
    "open_table",
    "postmap",
    "strip_extension",
]

TABLE_TYPES = ("inline", "texthash", "hash", "lmdb", "regexp", "pcre", "cidr", "static")


def open_table(spec: str, *, base_dir: Path) -> LookupTable:
    """Open ``type:name``; ConfigError naming file and line for anything wrong."""
    spec = spec.strip()
    kind, sep, name = spec.partition(":")
    if not sep or not kind:
        raise ConfigError(f"{spec!r}: expected a lookup table as type:name")
    if kind not in TABLE_TYPES:
        raise ConfigError(
            f"{spec}: unsupported lookup table type {kind!r} (qmgrd has {', '.join(TABLE_TYPES)})"
        )
    if kind == "inline":
        return InlineTable(spec)
    if kind == "static":
        return StaticTable(spec)
    inline = name.lstrip().startswith("{")
    if not name.strip():
        raise ConfigError(f"{spec}: missing table name after {kind}:")
    if kind in ("regexp", "pcre", "cidr") and inline:
        rules = inline_rules(spec, kind)
        if kind == "cidr":
            return CidrTable(spec, inline=rules)
        return RegexpTable(spec, pcre=kind == "pcre", inline=rules)
    if inline:
        raise ConfigError(f"{spec}: a {kind} table needs a file name, not {{ ... }}")
    path = resolve_path(name, base_dir)
    if kind == "texthash":
        return TextHashTable(spec, path)
    if kind in INDEXED_TYPES:
        return IndexedTable(spec, path)
    if kind == "cidr":
        return CidrTable(spec, path=path)
    return RegexpTable(spec, pcre=kind == "pcre", path=path)
