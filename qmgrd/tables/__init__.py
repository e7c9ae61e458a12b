"""Lookup tables (Postfix's ``type:name`` maps): a MINIMAL stand-in.

The full ``qmgrd.tables`` package (hash:, lmdb:, regexp:, pcre:, cidr:, static:,
texthash:, inline:) is being built on another branch and REPLACES this module at
merge; it keeps exactly this API:

- ``LookupTable``: ``spec`` (as written in main.cf) and ``lookup(key)`` returning
  the value for an exact key (case-insensitive for non-regexp tables) or None;
- ``open_table(spec, base_dir=...)``: open a table once (at start or reload),
  raising ``qmgrd.errors.ConfigError`` naming the file and line of a bad entry.

This stand-in supports only ``inline:{ key=value, ... }`` and ``texthash:/path``
(postmap input format: ``key whitespace value``, ``#`` comments, indented
continuation lines; the first entry of a duplicated key wins). Both are read
whole when opened, so ``lookup`` does no I/O. A relative path is relative to
``base_dir`` (the configuration directory).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from qmgrd.errors import ConfigError

__all__ = ["LookupTable", "open_table"]


class LookupTable(Protocol):
    """A table opened from a ``type:name`` spec."""

    spec: str  # as written in main.cf, e.g. "texthash:/etc/qmgrd/sasl_passwd"

    def lookup(self, key: str) -> str | None:
        """The value of ``key`` (exact key; case-insensitive for non-regexp tables), or None."""
        ...


@dataclass(slots=True, eq=False)
class _DictTable:
    """A table held in memory, keys lowercased."""

    spec: str
    entries: Mapping[str, str]

    def lookup(self, key: str) -> str | None:
        """The value of ``key``, compared case-insensitively, or None."""
        return self.entries.get(key.lower())


def open_table(spec: str, *, base_dir: Path) -> LookupTable:
    """Open ``spec``; ConfigError naming the file and line for bad input or an unknown type."""
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise ConfigError(f"table {spec!r}: expected type:name")
    if kind == "inline":
        return _DictTable(spec, MappingProxyType(_parse_inline(spec, rest)))
    if kind == "texthash":
        path = Path(rest)
        if not path.is_absolute():
            path = base_dir / path
        try:
            text = path.read_text(encoding="utf-8", errors="surrogateescape")
        except OSError as exc:
            raise ConfigError(
                f"table {spec!r}: cannot read {path}: {exc.strerror or exc}"
            ) from None
        return _DictTable(spec, MappingProxyType(_parse_texthash(path, text)))
    raise ConfigError(f"table {spec!r}: unsupported table type {kind!r} (use inline or texthash)")


def _parse_inline(spec: str, body: str) -> dict[str, str]:
    body = body.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ConfigError(f"table {spec!r}: expected inline:{{ key=value, ... }}")
    entries: dict[str, str] = {}
    for index, token in enumerate(_split_braced(spec, body[1:-1]), start=1):
        if token.startswith("{"):
            token = token[1:-1].strip()
        key, sep, value = token.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ConfigError(f"table {spec!r}: element {index}: expected key=value")
        entries.setdefault(key.lower(), value)
    return entries


def _split_braced(spec: str, body: str) -> list[str]:
    """Split on commas and whitespace outside braces; a braced token keeps its braces."""
    tokens: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"table {spec!r}: unbalanced '}}'")
        if depth == 0 and (ch == "," or ch.isspace()):
            if current:
                tokens.append("".join(current))
                current = []
            continue
        current.append(ch)
    if depth != 0:
        raise ConfigError(f"table {spec!r}: unbalanced '{{'")
    if current:
        tokens.append("".join(current))
    return tokens


def _parse_texthash(path: Path, text: str) -> dict[str, str]:
    logical: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if line[0].isspace():
            if not logical:
                raise ConfigError(
                    f"{path}, line {number}: continuation line without a preceding entry"
                )
            start, previous = logical[-1]
            logical[-1] = (start, f"{previous} {stripped}")
            continue
        logical.append((number, stripped))
    entries: dict[str, str] = {}
    for number, entry in logical:
        parts = entry.split(None, 1)
        if len(parts) != 2:
            # Never echo the line: it may hold a password (smtp_sasl_password_maps).
            raise ConfigError(f"{path}, line {number}: expected 'key whitespace value'")
        entries.setdefault(parts[0].lower(), parts[1].strip())
    return entries
