"""header_checks / smtp_header_checks: tables and actions (header_checks(5)).

Contract
--------
- `open_header_checks(tables, where)` takes the opened ``regexp:``/``pcre:``
  tables of a ``*header_checks`` parameter and checks, at start, that every
  rule's action is one qmgrd implements: a table of another type, or a rule
  with ``FILTER``, ``BCC``, ``STRIP`` or an unknown word, is a `ConfigError`
  naming the parameter, the file and the line (Postfix only warns at run time
  and ignores such a rule; a relay that silently skips a filter fails open).
- `HeaderChecks.check(text)` looks one logical header up (continuation lines
  joined with a newline, as Postfix does, without the final line ending) and
  returns an `Action` or None. It never raises for any input.

Actions (header_checks(5)): ``REJECT [text]``, ``WARN [text]``, ``IGNORE``,
``REPLACE text``, ``PREPEND text``, ``HOLD [text]``, ``DISCARD [text]``,
``REDIRECT user@domain``, ``INFO [text]``, ``DUNNO`` and ``OK`` (no action).
For ``smtp_header_checks`` (on the way out, while DATA streams) the message
is already accepted and the transaction under way: qmgrd implements
``DUNNO``, ``OK``, ``IGNORE``, ``INFO``, ``PREPEND``, ``REPLACE`` and ``WARN``
there; the others (Postfix's client also has ``DISCARD``) are a start-up
error (``outbound=True``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qmgrd.errors import ConfigError
from qmgrd.tables import LookupTable
from qmgrd.tables.base import read_table_file, table_lines
from qmgrd.tables.simple import inline_rules


class Verb(enum.Enum):
    """A header_checks action word."""

    REJECT = "REJECT"
    WARN = "WARN"
    INFO = "INFO"
    IGNORE = "IGNORE"
    REPLACE = "REPLACE"
    PREPEND = "PREPEND"
    HOLD = "HOLD"
    DISCARD = "DISCARD"
    REDIRECT = "REDIRECT"
    DUNNO = "DUNNO"
    OK = "OK"


INBOUND = frozenset(Verb)
OUTBOUND = frozenset(
    {
        Verb.DUNNO,
        Verb.OK,
        Verb.IGNORE,
        Verb.INFO,
        Verb.PREPEND,
        Verb.REPLACE,
        Verb.WARN,
    }
)
_NEEDS_TEXT = frozenset({Verb.REPLACE, Verb.PREPEND, Verb.REDIRECT})


@dataclass(frozen=True, slots=True)
class Action:
    """One rule's result: the verb and its text (may be empty)."""

    verb: Verb
    text: str


def parse_action(result: str) -> Action | None:
    """``VERB text`` -> Action; None for an unknown or incomplete action."""
    word, _, text = result.strip().partition(" ")
    try:
        verb = Verb(word.upper())
    except ValueError:
        return None
    text = text.strip()
    if verb in _NEEDS_TEXT and not text:
        return None
    return Action(verb, text)


@dataclass(frozen=True, slots=True)
class HeaderChecks:
    """The tables of one header_checks parameter, validated."""

    tables: tuple[LookupTable, ...]

    def __bool__(self) -> bool:
        return bool(self.tables)

    def check(self, text: str) -> Action | None:
        """The first table's result for this header, as an action (None: no match)."""
        for table in self.tables:
            found = table.lookup(text)
            if found is not None:
                action = parse_action(found)
                if action is None or action.verb in (Verb.DUNNO, Verb.OK):
                    return None
                return action
        return None


def _rule_result(line: str) -> str | None:
    """The result text of a ``/pattern/flags result`` line (None for if/endif)."""
    word = line.split(None, 1)[0] if line.split() else ""
    if word == "endif":
        return None
    if word == "if" and line[2:3].isspace():
        return None
    text = line[1:].lstrip() if line.startswith("!") else line
    if not text:
        return None
    delim = text[0]
    i = 1
    while i < len(text) and text[i] != delim:
        i += 2 if text[i] == "\\" else 1
    j = i + 1
    while j < len(text) and not text[j].isspace():
        j += 1
    return text[j:].strip()


def _rule_lines(table: LookupTable, config_dir: Path) -> list[tuple[str, int, str]]:
    kind, _, name = table.spec.partition(":")
    if name.lstrip().startswith("{"):
        return [(table.spec, n, r) for n, r in enumerate(inline_rules(table.spec, kind), 1)]
    path = Path(name.strip())
    if not path.is_absolute():
        path = config_dir / path
    where = str(path)
    return [(where, n, line) for n, line in table_lines(read_table_file(path), where)]


def open_header_checks(
    tables: Sequence[LookupTable], where: str, config_dir: Path, *, outbound: bool = False
) -> HeaderChecks:
    """Validate every rule's action (module doc); ConfigError naming file and line."""
    allowed = OUTBOUND if outbound else INBOUND
    for table in tables:
        kind = table.spec.partition(":")[0]
        if kind not in ("regexp", "pcre"):
            raise ConfigError(f"{where}: {table.spec}: header checks need a regexp: or pcre: table")
        for file, number, line in _rule_lines(table, config_dir):
            result = _rule_result(line)
            if result is None:
                continue
            action = parse_action(result)
            if action is None or action.verb not in allowed:
                word = result.split(None, 1)[0] if result.split() else result
                names = ", ".join(sorted(v.value for v in allowed))
                raise ConfigError(
                    f"{where}: {file}, line {number}: action {word!r} is not supported "
                    f"here (qmgrd implements {names})"
                )
    return HeaderChecks(tuple(tables))
