"""Reading main.cf and master.cf into raw, unexpanded settings (DESIGN §8).

Both files share Postfix's logical-line rules (readlline.c):

- a logical line starts in column 1; a line that starts with whitespace
  continues the previous logical line (joined with one space);
- a line whose first non-blank character is ``#`` is a comment, also between
  the lines of a continued entry; there are no trailing comments;
- empty and all-blank lines are ignored.

main.cf lines are ``name = value`` (blanks around ``=`` optional); a later
setting replaces an earlier one. Values are kept exactly as written:
``$name`` expansion happens at lookup (`qmgrd.config.expand`).

master.cf lines are ``service type private unpriv chroot wakeup maxproc
command [args]``; ``-o name=value`` (or ``-o { name = value }``, whose value
may contain blanks) sets a parameter for that service. Every error raised
here is a `ConfigError` naming the file and the line.

An ``inet`` line is an SMTP listener (`inet_endpoint` reads its service
field: ``submission``, ``587``, ``127.0.0.1:2525``); its command must be
``smtpd``, the only server qmgrd has.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from qmgrd.errors import ConfigError

NAME_RE = re.compile(r"[A-Za-z0-9_]+")
_MASTER_TYPES = frozenset({"inet", "unix", "unix-dgram", "fifo", "pass"})


@dataclass(frozen=True, slots=True)
class Setting:
    """One ``name = value`` as written, and where (for error messages)."""

    name: str
    value: str
    file: Path
    line: int

    @property
    def where(self) -> str:
        """``/etc/qmgrd/main.cf, line 12`` — the prefix of every message about it."""
        return f"{self.file}, line {self.line}"


@dataclass(frozen=True, slots=True)
class MasterEntry:
    """One master.cf service, as the engine uses it.

    ``maxproc`` is the service's limit on concurrent deliveries, resolved
    ("-" -> default_process_limit; 0 means no limit, as in Postfix).
    ``command`` names the agent (smtp, discard, error, retry, ...); qmgrd does
    not check it, the engine does. ``overrides`` are the ``-o`` settings as
    written (unexpanded); the `TransportConfig` view applies them.
    """

    name: str
    type: str
    maxproc: int
    command: str
    overrides: Mapping[str, str]
    args: tuple[str, ...] = ()  # command arguments other than -o settings
    file: Path = field(default=Path("master.cf"))
    line: int = 0
    maxproc_given: bool = False  # maxproc was a number, not "-"


@dataclass(frozen=True, slots=True)
class RawMasterEntry:
    """A master.cf entry before ``maxproc`` is resolved against main.cf."""

    name: str
    type: str
    maxproc: int | None  # None = "-"
    command: str
    args: tuple[str, ...]
    overrides: Mapping[str, Setting]
    file: Path
    line: int


def read_text(path: Path) -> str:
    """The whole file, or a ConfigError naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None


def logical_lines(
    text: str,
    path: Path | str,
    *,
    leading_error: str = "logical line must not start with whitespace",
) -> Iterator[tuple[int, str]]:
    """Yield (number of the first physical line, joined text) for each logical line.

    Postfix's rule for main.cf and table files alike: ``#`` lines and blank lines are skipped,
    an indented line continues the previous one (``leading_error`` when there is none)."""
    start = 0
    parts: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if raw[0].isspace():
            if not parts:
                raise ConfigError(
                    f"{path}, line {number}: {leading_error}"
                )
            parts.append(stripped)
            continue
        if parts:
            yield start, " ".join(parts)
        start, parts = number, [raw.rstrip()]
    if parts:
        yield start, " ".join(parts)


def parse_main_cf(text: str, path: Path) -> dict[str, Setting]:
    """Parse main.cf text into settings by name; the last setting of a name wins."""
    settings: dict[str, Setting] = {}
    for number, line in logical_lines(text, path):
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep:
            raise ConfigError(f"{path}, line {number}: missing '=' after parameter name: {line!r}")
        if not NAME_RE.fullmatch(name):
            raise ConfigError(f"{path}, line {number}: bad parameter name: {name!r}")
        settings[name] = Setting(name, value.strip(), path, number)
    return settings


def _tokens(line: str, path: Path, number: int) -> list[str]:
    """Split on blanks; ``{ ... }`` is one token (braces removed, inner blanks kept)."""
    tokens: list[str] = []
    i, n = 0, len(line)
    while i < n:
        if line[i].isspace():
            i += 1
            continue
        if line[i] == "{":
            close = line.find("}", i + 1)
            if close < 0:
                raise ConfigError(f"{path}, line {number}: missing '}}'")
            tokens.append(line[i + 1 : close].strip())
            i = close + 1
            continue
        j = i
        while j < n and not line[j].isspace():
            j += 1
        tokens.append(line[i:j])
        i = j
    return tokens


def _parse_override(text: str, path: Path, number: int) -> Setting:
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not NAME_RE.fullmatch(name):
        raise ConfigError(f"{path}, line {number}: bad -o option, expected name=value: {text!r}")
    return Setting(name, value.strip(), path, number)


def _parse_master_line(line: str, path: Path, number: int) -> RawMasterEntry:
    tokens = _tokens(line, path, number)
    if len(tokens) < 8:
        raise ConfigError(
            f"{path}, line {number}: expected 8 or more fields "
            "(service type private unpriv chroot wakeup maxproc command), "
            f"got {len(tokens)}"
        )
    name, type_, _private, _unpriv, _chroot, _wakeup, maxproc_text, command = tokens[:8]
    if not NAME_RE.fullmatch(name) and type_ != "inet":
        raise ConfigError(f"{path}, line {number}: bad service name: {name!r}")
    if type_ not in _MASTER_TYPES:
        raise ConfigError(
            f"{path}, line {number}: service {name}: bad type {type_!r} "
            f"(expected one of {', '.join(sorted(_MASTER_TYPES))})"
        )
    if type_ == "inet":
        try:
            inet_endpoint(name)
        except ValueError as exc:
            raise ConfigError(f"{path}, line {number}: service {name}: {exc}") from None
        if command != "smtpd":
            raise ConfigError(
                f"{path}, line {number}: service {name}: inet services must run smtpd "
                f"(qmgrd has no {command}); remove the line"
            )
    maxproc: int | None = None
    if maxproc_text != "-":
        if not maxproc_text.isdigit():
            raise ConfigError(
                f"{path}, line {number}: service {name}: bad maxproc {maxproc_text!r} "
                "(expected a number or -)"
            )
        maxproc = int(maxproc_text)
    overrides: dict[str, Setting] = {}
    args: list[str] = []
    rest = tokens[8:]
    i = 0
    while i < len(rest):
        token = rest[i]
        if token == "-o":
            if i + 1 >= len(rest):
                raise ConfigError(f"{path}, line {number}: service {name}: -o without a value")
            setting = _parse_override(rest[i + 1], path, number)
            i += 2
        elif token.startswith("-o") and len(token) > 2:
            setting = _parse_override(token[2:], path, number)
            i += 1
        else:
            args.append(token)
            i += 1
            continue
        overrides[setting.name] = setting
    return RawMasterEntry(
        name, type_, maxproc, command, tuple(args), MappingProxyType(overrides), path, number
    )


# Postfix looks service names up in /etc/services; these are fixed so that a
# minimal container without that file reads the usual master.cf the same way.
_SERVICE_PORTS: Mapping[str, int] = MappingProxyType(
    {"smtp": 25, "submission": 587, "smtps": 465, "submissions": 465}
)


def inet_endpoint(name: str) -> tuple[str | None, int]:
    """An inet service name as (host, port): ``submission`` -> (None, 587), ``127.0.0.1:2525``.

    A bare port or service name (no host) gives None: the listener binds it
    on the hosts of ``smtpd_listen``, as Postfix binds on ``inet_interfaces``.
    ``[::1]:587`` and ``*:587`` (every address, host "") are accepted.
    ValueError says what is wrong.
    """
    host: str | None = None
    service = name
    if name.startswith("["):
        close = name.find("]:")
        if close < 0:
            raise ValueError(f"bad address {name!r} (expected [host]:port)")
        host, service = name[1:close], name[close + 2 :]
    elif ":" in name:
        host, _, service = name.rpartition(":")
        if ":" in host:
            raise ValueError(f"bad address {name!r} (write an IPv6 address as [addr]:port)")
        host = "" if host == "*" else host
    if service.isdigit():
        port = int(service)
    elif service in _SERVICE_PORTS:
        port = _SERVICE_PORTS[service]
    else:
        try:
            port = socket.getservbyname(service, "tcp")
        except OSError:
            raise ValueError(f"unknown service {service!r} (use a port number)") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"bad port {service!r}")
    return host, port


def parse_master_cf(text: str, path: Path) -> list[RawMasterEntry]:
    """Parse master.cf text; a service name may appear once per type kind.

    Postfix keys services by (name, type): ``smtp inet ... smtpd`` and
    ``smtp unix ... smtp`` coexist. Two entries with the same name that are
    both ``inet`` or both non-inet are an error.
    """
    entries: list[RawMasterEntry] = []
    seen: dict[tuple[str, bool], RawMasterEntry] = {}
    for number, line in logical_lines(text, path):
        entry = _parse_master_line(line, path, number)
        key = (entry.name, entry.type == "inet")
        if key in seen:
            raise ConfigError(
                f"{path}, line {number}: duplicate service {entry.name} "
                f"(first defined at line {seen[key].line})"
            )
        seen[key] = entry
        entries.append(entry)
    return entries
