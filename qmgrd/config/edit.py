"""Editing main.cf in place: ``postconf -e name=value`` and ``postconf -# name``.

Contract
--------
- `set_params(text, {name: value})` returns main.cf text where the first
  logical line setting ``name`` (with its continuation lines) is replaced by
  ``name = value``, later settings of the same name are removed (they would
  override it), and names not set yet are appended. Comments, blank lines and
  every other line are kept byte for byte.
- `comment_params(text, names)` prefixes ``#`` to every physical line of each
  setting of those names (a continuation line left uncommented would attach
  itself to the previous setting).
- `write_atomically(path, text)` writes a temporary file next to main.cf,
  syncs it, gives it main.cf's mode, and renames it over main.cf: a crash or
  a full disk leaves the old file or the new one, never half of one.

The CLI validates the edited text with the whole configuration (as the daemon
would load it) before writing: a bad value is refused with the file, the line
and the parameter, and main.cf is not touched.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from qmgrd.config.files import NAME_RE
from qmgrd.errors import ConfigError


def parse_assignment(arg: str) -> tuple[str, str]:
    """``name=value`` (blanks around ``=`` allowed) -> (name, value); ConfigError if malformed."""
    name, sep, value = arg.partition("=")
    name = name.strip()
    if not sep or not NAME_RE.fullmatch(name):
        raise ConfigError(f"bad parameter assignment {arg!r}: expected name=value")
    if "\n" in value or "\r" in value:
        raise ConfigError(f"parameter {name}: the value must be one line")
    return name, value.strip()


def _setting_spans(lines: list[str]) -> list[tuple[str, int, list[int]]]:
    """(name, first line index, indexes of its continuation lines) per main.cf setting."""
    spans: list[tuple[str, int, list[int]]] = []
    current: tuple[str, int, list[int]] | None = None
    for index, raw in enumerate(lines):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if raw[0].isspace():
            if current is not None:
                current[2].append(index)
            continue
        name = raw.partition("=")[0].strip()
        current = (name, index, [])
        spans.append(current)
    return spans


def set_params(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each ``name = value`` set (module doc)."""
    lines = text.splitlines(keepends=True)
    replaced: set[str] = set()
    drop: set[int] = set()
    for name, first, rest in _setting_spans(lines):
        if name not in values:
            continue
        drop.update(rest)
        if name in replaced:
            drop.add(first)
            continue
        replaced.add(name)
        ending = "\n" if lines[first].endswith("\n") else ""
        lines[first] = f"{name} = {values[name]}{ending}"
    out = [line for i, line in enumerate(lines) if i not in drop]
    if out and not out[-1].endswith("\n"):
        out[-1] += "\n"
    for name, value in values.items():
        if name not in replaced:
            out.append(f"{name} = {value}\n")
    return "".join(out)


def comment_params(text: str, names: Iterable[str]) -> str:
    """``text`` with every setting of ``names`` commented out (module doc)."""
    wanted = set(names)
    lines = text.splitlines(keepends=True)
    for name, first, rest in _setting_spans(lines):
        if name in wanted:
            for index in (first, *rest):
                lines[index] = f"#{lines[index]}"
    return "".join(lines)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, keeping its mode; ConfigError on failure."""
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    except OSError as exc:
        raise ConfigError(f"{path}: cannot stat: {exc.strerror or exc}") from None
    tmp_name = ""
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        if tmp_name:
            Path(tmp_name).unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot write: {exc.strerror or exc}; left unchanged") from None
