"""``regexp:`` and ``pcre:`` tables with Python's `re` (regexp_table(5), pcre_table(5)).

Table format (Postfix's)
------------------------
``/pattern/flags result``, ``!/pattern/flags result``, ``if /pattern/flags``,
``if !/pattern/flags`` ... ``endif`` (nesting allowed), ``#`` comments, blank
lines, continuation lines starting with whitespace. The delimiter is any
non-alphanumeric, non-blank character after the optional ``!``; a backslash
escapes it inside the pattern. Patterns are tried in order against the whole
key; the first match gives the result, in which ``$1``, ``${1}``, ``$(1)``
are the matched groups (an unmatched group is empty) and ``$$`` is a dollar.
The inline form ``regexp:{ { rule }, { rule } }`` (Postfix 3.7) works too.

Flags: matching is case-insensitive unless ``i`` is given (it toggles, as in
Postfix). regexp: ``m`` multi-line; ``x`` (switch off extended syntax) is
refused: Python has no POSIX basic regular expressions. pcre: ``i``, ``m``,
``s`` (dot matches newline), ``x`` (verbose), ``A`` (anchored at the start),
``E`` and ``X`` (accepted, no effect in Python); ``U`` (ungreedy) is refused.

Differences from Postfix (documented in README "Differences from Postfix"):
both types use Python's `re`, a Perl-like engine: for ``regexp:`` this means
leftmost-first instead of POSIX leftmost-longest alternation and Perl escapes
(``\\d``) instead of literals; POSIX bracket classes (``[[:alnum:]]``) are
translated. A pattern that does not compile, an unknown flag, a ``$n`` beyond
the pattern's groups, ``$n`` in a negated rule, a missing result, and an
``endif`` without ``if`` (or the reverse) are `ConfigError`s naming the file
and the line. Python's `re` has no time limit: keep patterns free of nested
quantifiers on untrusted keys (addresses are at most a few hundred bytes).
"""

from __future__ import annotations

import enum
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from qmgrd.errors import ConfigError
from qmgrd.tables.base import Watched, read_table_file, table_lines

_POSIX_CLASSES = {
    "alnum": "a-zA-Z0-9",
    "alpha": "a-zA-Z",
    "blank": " \\t",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "\\x21-\\x7e",
    "lower": "a-z",
    "print": "\\x20-\\x7e",
    "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    "space": " \\t\\n\\r\\f\\v",
    "upper": "A-Z",
    "xdigit": "0-9A-Fa-f",
    "word": "\\w",
}
_POSIX_RE = re.compile(r"\[:([a-z]+):\]")
_SUBST_RE = re.compile(r"\$(?:\$|([0-9]+)|\{([0-9]+)\}|\(([0-9]+)\))")


class _Kind(enum.Enum):
    MATCH = "match"
    IF = "if"
    ENDIF = "endif"


@dataclass(frozen=True, slots=True)
class _Rule:
    kind: _Kind
    regex: re.Pattern[str] | None
    negate: bool
    anchored: bool
    template: tuple[str | int, ...]  # literal text or group numbers
    skip_to: int  # IF: index after the matching ENDIF


def _translate_posix(pattern: str) -> str:
    def repl(m: re.Match[str]) -> str:
        found = _POSIX_CLASSES.get(m.group(1))
        return found if found is not None else m.group(0)

    return _POSIX_RE.sub(repl, pattern)


def _template(text: str, where: str, groups: int, negate: bool) -> tuple[str | int, ...]:
    parts: list[str | int] = []
    pos = 0
    for m in _SUBST_RE.finditer(text):
        parts.append(text[pos : m.start()])
        pos = m.end()
        number = m.group(1) or m.group(2) or m.group(3)
        if number is None:
            parts.append("$")
            continue
        if negate:
            raise ConfigError(f"{where}: $number in the result of a negated pattern")
        if int(number) > groups:
            raise ConfigError(
                f"{where}: out of range replacement index ${number} "
                f"(the pattern has {groups} group{'s' if groups != 1 else ''})"
            )
        parts.append(int(number))
    rest = text[pos:]
    if "$" in rest:
        bad = rest[rest.index("$") :][:10]
        raise ConfigError(f"{where}: unsupported $ sequence {bad!r} (use $1, ${{1}} or $$)")
    parts.append(rest)
    return tuple(p for p in parts if p != "")


def _split_pattern(text: str, where: str) -> tuple[bool, str, str, str]:
    """``!/pat/flags rest`` -> (negate, pattern, flags, rest)."""
    negate = text.startswith("!")
    if negate:
        text = text[1:].lstrip()
    if not text:
        raise ConfigError(f"{where}: missing pattern")
    delim = text[0]
    if delim.isalnum() or delim.isspace() or delim == "\\":
        raise ConfigError(
            f"{where}: pattern must start with a delimiter such as '/', got {delim!r}"
        )
    i = 1
    while i < len(text) and text[i] != delim:
        i += 2 if text[i] == "\\" else 1
    if i >= len(text):
        raise ConfigError(f"{where}: missing closing {delim!r} of the pattern")
    pattern = text[1:i]
    j = i + 1
    while j < len(text) and not text[j].isspace():
        j += 1
    return negate, pattern, text[i + 1 : j], text[j:].strip()


def _compile(pattern: str, flags: str, where: str, pcre: bool) -> tuple[re.Pattern[str], bool]:
    ignore_case, anchored = True, False
    extra = 0
    allowed = "imsxAEUX" if pcre else "imx"
    for flag in flags:
        if flag not in allowed:
            raise ConfigError(f"{where}: unknown flag {flag!r} (allowed: {allowed})")
        if flag == "i":
            ignore_case = not ignore_case
        elif flag == "m":
            extra |= re.MULTILINE
        elif flag == "s":
            extra |= re.DOTALL
        elif flag == "x" and pcre:
            extra ^= re.VERBOSE
        elif flag == "x":
            raise ConfigError(f"{where}: flag x (POSIX basic syntax) is not supported")
        elif flag == "A":
            anchored = True
        elif flag == "U":
            raise ConfigError(f"{where}: flag U (ungreedy) is not supported; use *? and +?")
    if ignore_case:
        extra |= re.IGNORECASE
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "possible nested set" and similar hints
            return re.compile(_translate_posix(pattern), extra), anchored
    except re.error as exc:
        raise ConfigError(f"{where}: bad regular expression /{pattern}/: {exc}") from None


def parse_rules(lines: list[tuple[int, str]], where: str, pcre: bool) -> tuple[_Rule, ...]:
    """Compile the logical lines of a regexp/pcre table."""
    rules: list[_Rule] = []
    open_ifs: list[tuple[int, int]] = []  # (rule index, line number)
    for number, line in lines:
        here = f"{where}, line {number}"
        word = line.split(None, 1)[0]
        if word == "endif":
            if line != "endif":
                raise ConfigError(f"{here}: text after endif: {line!r}")
            if not open_ifs:
                raise ConfigError(f"{here}: endif without a matching if")
            start, _ = open_ifs.pop()
            rules.append(_Rule(_Kind.ENDIF, None, False, False, (), 0))
            rules[start] = _Rule(
                _Kind.IF,
                rules[start].regex,
                rules[start].negate,
                rules[start].anchored,
                (),
                len(rules),
            )
            continue
        is_if = word == "if" and line[2:3].isspace()
        body = line[2:].strip() if is_if else line
        negate, pattern, flags, rest = _split_pattern(body, here)
        regex, anchored = _compile(pattern, flags, here, pcre)
        if is_if:
            if rest:
                raise ConfigError(f"{here}: text after the if pattern: {rest!r}")
            open_ifs.append((len(rules), number))
            rules.append(_Rule(_Kind.IF, regex, negate, anchored, (), 0))
            continue
        if not rest:
            raise ConfigError(f"{here}: missing result after the pattern")
        template = _template(rest, here, regex.groups, negate)
        rules.append(_Rule(_Kind.MATCH, regex, negate, anchored, template, 0))
    if open_ifs:
        raise ConfigError(f"{where}, line {open_ifs[-1][1]}: if without a matching endif")
    return tuple(rules)


def _evaluate(rules: tuple[_Rule, ...], key: str) -> str | None:
    i, n = 0, len(rules)
    while i < n:
        rule = rules[i]
        if rule.kind is _Kind.ENDIF:
            i += 1
            continue
        assert rule.regex is not None
        m = rule.regex.match(key) if rule.anchored else rule.regex.search(key)
        hit = (m is None) if rule.negate else (m is not None)
        if rule.kind is _Kind.IF:
            i = i + 1 if hit else rule.skip_to
            continue
        if hit:
            if m is None or rule.negate:
                return "".join(p for p in rule.template if isinstance(p, str))
            return "".join(p if isinstance(p, str) else (m.group(p) or "") for p in rule.template)
        i += 1
    return None


class RegexpTable:
    """``regexp:FILE``, ``pcre:FILE`` or their inline forms."""

    __slots__ = ("_rules", "_watched", "spec")

    def __init__(
        self, spec: str, *, pcre: bool, path: Path | None = None, inline: list[str] | None = None
    ) -> None:
        """Compile the rules from ``path`` (re-read when it changes) or ``inline`` rules."""
        self.spec = spec
        self._watched: Watched[tuple[_Rule, ...]] | None = None
        self._rules: tuple[_Rule, ...] = ()
        if path is not None:
            self._watched = Watched(
                path,
                lambda p: parse_rules(list(table_lines(read_table_file(p), str(p))), str(p), pcre),
            )
        else:
            lines = list(enumerate(inline or [], start=1))
            self._rules = parse_rules(lines, spec, pcre)

    def lookup(self, key: str) -> str | None:
        """The result of the first rule that matches ``key``, substituted; None if none."""
        rules = self._watched.current() if self._watched is not None else self._rules
        return _evaluate(rules, key)
