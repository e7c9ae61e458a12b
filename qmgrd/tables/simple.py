"""The dictionary tables: ``inline:``, ``texthash:`` and ``static:``.

Contract
--------
- ``inline:{ key=value, { key = text, with commas }, ... }`` (Postfix 3.0): elements
  separated by commas or whitespace; an element wrapped in ``{}`` may contain
  both, and blanks around its ``=`` are ignored.
- ``texthash:FILE`` (Postfix 2.8): the postmap(1) input format read directly:
  ``key whitespace value`` per logical line (see `qmgrd.tables.base.table_lines`),
  re-read when the file changes. A duplicate key keeps the first value with a
  warning, as postmap does.
- ``static:value`` / ``static:{ value with blanks }``: every lookup returns the value.

Keys are stored and looked up in lower case (Postfix folds keys of fixed
tables); values are kept as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from qmgrd.errors import ConfigError
from qmgrd.tables.base import Watched, log_warnings, read_table_file, table_lines


def split_braced(where: str, body: str) -> list[str]:
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
                raise ConfigError(f"{where}: unbalanced '}}'")
        if depth == 0 and (ch == "," or ch.isspace()):
            if current:
                tokens.append("".join(current))
                current = []
            continue
        current.append(ch)
    if depth != 0:
        raise ConfigError(f"{where}: unbalanced '{{'")
    if current:
        tokens.append("".join(current))
    return tokens


def inline_body(spec: str, kind: str) -> str:
    """The text between the outer braces of ``kind:{ ... }``; ConfigError if there are none."""
    body = spec[len(kind) + 1 :].strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ConfigError(f"{spec}: expected {kind}:{{ ... }}")
    return body[1:-1]


def inline_rules(spec: str, kind: str) -> list[str]:
    """The rules of ``regexp:{ { rule }, { rule } }`` (and cidr/pcre), braces removed."""
    rules = []
    for token in split_braced(spec, inline_body(spec, kind)):
        rules.append(token[1:-1].strip() if token.startswith("{") else token)
    return rules


def parse_pairs(lines: list[tuple[int, str]], where: str) -> tuple[dict[str, str], list[str]]:
    """``key value`` logical lines -> (mapping with first-wins keys, duplicate warnings)."""
    pairs: dict[str, str] = {}
    warnings: list[str] = []
    for number, entry in lines:
        parts = entry.split(None, 1)
        if len(parts) != 2:
            raise ConfigError(
                # the line is not quoted: a password map's line may hold a secret
                f"{where}, line {number}: expected format: key whitespace value "
                "(the line has a key and no value)"
            )
        key = parts[0].lower()
        if key in pairs:
            warnings.append(f"{where}, line {number}: duplicate entry: {key!r} (ignored)")
            continue
        pairs[key] = parts[1].strip()
    return pairs, warnings


def parse_key_value_file(path: Path) -> tuple[dict[str, str], list[str]]:
    """Read and parse a postmap-format source file."""
    where = str(path)
    return parse_pairs(list(table_lines(read_table_file(path), where)), where)


def _load_logged(path: Path) -> tuple[dict[str, str], list[str]]:
    """`parse_key_value_file`, logging its duplicate-key warnings (texthash, as dict_thash)."""
    pairs, warnings = parse_key_value_file(path)
    log_warnings(warnings)
    return pairs, warnings


class InlineTable:
    """``inline:{ key=value, ... }``."""

    __slots__ = ("_entries", "spec", "warnings")

    def __init__(self, spec: str) -> None:
        """Parse the elements; ConfigError naming the element for a malformed one."""
        self.spec = spec
        entries: dict[str, str] = {}
        warnings: list[str] = []
        for index, token in enumerate(split_braced(spec, inline_body(spec, "inline")), start=1):
            if token.startswith("{"):
                token = token[1:-1].strip()
            key, sep, value = token.partition("=")
            key, value = key.strip().lower(), value.strip()
            if not sep or not key:
                raise ConfigError(f"{spec}: element {index}: expected key=value, got {token!r}")
            if key in entries:
                warnings.append(f"{spec}: element {index}: duplicate entry: {key!r} (ignored)")
                continue
            entries[key] = value
        self._entries: Mapping[str, str] = MappingProxyType(entries)
        self.warnings = tuple(warnings)
        log_warnings(warnings)

    def lookup(self, key: str) -> str | None:
        """The value of ``key`` (case-insensitive)."""
        return self._entries.get(key.lower())


class TextHashTable:
    """``texthash:FILE``: the source file read into memory, re-read when it changes."""

    __slots__ = ("_watched", "spec")

    def __init__(self, spec: str, path: Path) -> None:
        """Read ``path`` now; ConfigError naming the file and line if it is malformed."""
        self.spec = spec
        self._watched = Watched(path, _load_logged)

    @property
    def warnings(self) -> tuple[str, ...]:
        """Duplicate-key warnings of the current contents."""
        return tuple(self._watched.current()[1])

    def lookup(self, key: str) -> str | None:
        """The value of ``key`` (case-insensitive)."""
        return self._watched.current()[0].get(key.lower())


class StaticTable:
    """``static:value``: the same value for every key."""

    __slots__ = ("_value", "spec")

    def __init__(self, spec: str) -> None:
        """``static:text`` or ``static:{ text with blanks }``."""
        self.spec = spec
        value = spec[len("static:") :].strip()
        if value.startswith("{"):
            value = inline_body(spec, "static").strip()
        self._value = value

    def lookup(self, key: str) -> str | None:
        """Always the value."""
        return self._value
