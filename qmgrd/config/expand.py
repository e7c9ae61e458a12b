"""``$name`` expansion over layered settings, with loop detection.

Theory of operation. A `Layers` object answers "what is the raw text of
parameter N?" by looking, in order, at:

1. the service's ``-o`` overrides (empty for the global view);
2. for a transport-specific name ``t_<suffix>``: a ``-o default_<suffix>``
   (any ``-o`` beats main.cf, since it is the more local setting);
3. main.cf;
4. the parameter table's default (``local_destination_*`` are declared);
5. for ``t_<suffix>``: the whole lookup again for ``default_<suffix>``.

A name found nowhere is *undefined* and expands to the empty string, as in
Postfix; that is not an error (user-defined names are allowed too).
Expansion is lazy (done at lookup, after every file is read), so a default
like ``$myhostname`` sees the configured host name. The syntax is Postfix's
mac_expand: ``$name``, ``${name}``, ``$(name)``, ``${name?text}`` (text if
name is non-empty), ``${name:text}`` (text if name is empty), ``$$`` for a
literal dollar. A name that needs itself is an expansion loop: a
`ConfigError` naming every parameter on the loop and where the first one is
set.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from qmgrd.config.files import Setting
from qmgrd.config.params import PARAMS, split_transport_name
from qmgrd.errors import ConfigError

_NAME_RE = re.compile(r"[A-Za-z0-9_]+")


@dataclass(frozen=True, slots=True)
class Raw:
    """Raw text of a parameter and the setting it came from (None for a table default)."""

    text: str
    setting: Setting | None


def _find_close(text: str, start: int, close: str) -> int:
    """Index of the ``close`` bracket matching the opening one just before ``start``."""
    opening = "{" if close == "}" else "("
    depth = 1
    for i in range(start, len(text)):
        if text[i] == opening:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i
    return -1


def references(text: str) -> set[str]:
    """Every parameter name that expanding ``text`` may look up."""
    found: set[str] = set()
    i = 0
    while True:
        i = text.find("$", i)
        if i < 0 or i + 1 >= len(text):
            return found
        nxt = text[i + 1]
        if nxt == "$":
            i += 2
        elif nxt in "{(":
            close = _find_close(text, i + 2, "}" if nxt == "{" else ")")
            if close < 0:
                return found
            inner = text[i + 2 : close]
            m = _NAME_RE.match(inner)
            if m:
                found.add(m.group(0))
                found |= references(inner[m.end() + 1 :])
            i = close + 1
        else:
            m = _NAME_RE.match(text, i + 1)
            if m:
                found.add(m.group(0))
                i = m.end()
            else:
                i += 1


@dataclass(slots=True, eq=False)
class Layers:
    """Raw lookup and memoised expansion for one view (global, or one transport)."""

    main: Mapping[str, Setting]
    defaults: Mapping[str, str]
    services: frozenset[str]
    overrides: Mapping[str, Setting] = field(default_factory=dict)
    _memo: dict[str, str] = field(default_factory=dict)

    def raw(self, name: str) -> Raw | None:
        """The raw text of ``name`` in this view, or None if undefined."""
        if name in self.overrides:
            return Raw(self.overrides[name].value, self.overrides[name])
        split = split_transport_name(name, self.services)
        if split is not None and split[1].name in self.overrides:
            setting = self.overrides[split[1].name]
            return Raw(setting.value, setting)
        if name in self.main:
            return Raw(self.main[name].value, self.main[name])
        if name in self.defaults:
            return Raw(self.defaults[name], None)
        if split is not None:
            return self.raw(split[1].name)
        return None

    def expand(self, name: str) -> str:
        """The fully expanded value of ``name`` ("" if undefined)."""
        return self._expand_name(name, [])

    def _expand_name(self, name: str, stack: list[str]) -> str:
        if name in self._memo:
            return self._memo[name]
        if name in stack:
            self._loop([*stack[stack.index(name) :], name])
        raw = self.raw(name)
        if raw is None:
            return ""
        stack.append(name)
        value = self._expand_text(raw.text, stack)
        stack.pop()
        self._memo[name] = value
        return value

    def _loop(self, cycle: list[str]) -> NoReturn:
        where = ""
        for member in cycle:
            raw = self.raw(member)
            if raw is not None and raw.setting is not None:
                where = f"{raw.setting.where}: parameter {member}: "
                break
        raise ConfigError(f"{where}expansion loop: {' -> '.join(cycle)}")

    def _expand_text(self, text: str, stack: list[str]) -> str:
        out: list[str] = []
        i = 0
        while i < len(text):
            dollar = text.find("$", i)
            if dollar < 0 or dollar + 1 >= len(text):
                out.append(text[i:])
                break
            out.append(text[i:dollar])
            nxt = text[dollar + 1]
            if nxt == "$":
                out.append("$")
                i = dollar + 2
            elif nxt in "{(":
                close = _find_close(text, dollar + 2, "}" if nxt == "{" else ")")
                if close < 0:  # unbalanced: keep literally, as written
                    out.append(text[dollar:])
                    break
                out.append(self._expand_braced(text[dollar + 2 : close], stack))
                i = close + 1
            else:
                m = _NAME_RE.match(text, dollar + 1)
                if m is None:  # "$" before something that is not a name: literal
                    out.append("$")
                    i = dollar + 1
                else:
                    out.append(self._expand_name(m.group(0), stack))
                    i = m.end()
        return "".join(out)

    def _expand_braced(self, inner: str, stack: list[str]) -> str:
        m = _NAME_RE.match(inner)
        if m is None:
            return ""
        value = self._expand_name(m.group(0), stack)
        rest = inner[m.end() :]
        if not rest:
            return value
        if rest[0] == "?":
            return self._expand_text(rest[1:], stack) if value else ""
        if rest[0] == ":":
            return "" if value else self._expand_text(rest[1:], stack)
        return value


def is_known(name: str, services: frozenset[str]) -> bool:
    """A table parameter, or ``t_<suffix>`` for a master.cf service t."""
    return name in PARAMS or split_transport_name(name, services) is not None
