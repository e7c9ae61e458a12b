"""The loaded configuration: frozen `Config` and per-transport `TransportConfig` views.

`load_config(dir)` reads ``dir/main.cf`` and ``dir/master.cf``, expands and
type-checks every value once, and returns a frozen `Config` (STYLE §8):
lookups never fail for a configuration reason after loading, and a reload
builds a new object. Errors are `ConfigError` one-liners naming the file, the
line and the parameter; the first bad line in file order is reported.
Unknown names only produce warnings (`Config.warnings`), as postconf does,
except that a name referenced from another value (``$mydest``) counts as used,
and that a Postfix parameter changing routing, content or security that qmgrd
does not implement is an error (`qmgrd.config.postfix`).

Asking for a name that is not declared, or with the wrong type (``get_int``
of a time) is a bug in the caller: `InvariantError`.

Lookup rules (see `qmgrd.config.expand` for the layering):

- ``cfg.get_int("relay_destination_concurrency_limit")`` works for every
  master.cf service and falls back to ``default_destination_concurrency_limit``;
- ``cfg.transport("relay").get_int("destination_concurrency_limit")`` is the
  same lookup with the service's ``-o`` settings on top; full names work on a
  view too (``tv.get_str("smtp_helo_name")``);
- ``bounce_queue_lifetime`` is clamped to ``maximal_queue_lifetime`` in
  `get_time` (Postfix does this at startup); postconf shows it as written;
- relative paths (`get_path`) are relative to the configuration directory.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from qmgrd.config.expand import Layers, is_known, references
from qmgrd.config.files import (
    MasterEntry,
    RawMasterEntry,
    Setting,
    parse_main_cf,
    parse_master_cf,
    read_text,
)
from qmgrd.config.params import PARAMS, PER_TRANSPORT, Param, ParamType, split_transport_name
from qmgrd.config.postfix import Kind, classify
from qmgrd.config.values import Value, convert, parse_hostport
from qmgrd.errors import ConfigError, InvariantError

MAIN_CF = "main.cf"
MASTER_CF = "master.cf"


@dataclass(frozen=True, slots=True)
class Resolved:
    """One parameter's expanded text and typed value in a view."""

    param: Param
    text: str
    value: Value


def _user_param(name: str) -> Param:
    return Param(name, ParamType.STR, "", "user-defined parameter")


def _domain_of(host: str) -> str:
    return host.split(".", 1)[1] if "." in host.strip(".") else "localdomain"


def compute_defaults(hostname: str | None = None) -> dict[str, str]:
    """Table defaults with the host-dependent ones filled in.

    ``myhostname`` defaults to the system host name (with ``.localdomain``
    appended when it has no dot, as Postfix does); ``mydomain`` to that minus
    its first label. `load_config` then re-derives ``mydomain`` from a
    configured ``myhostname``.
    """
    host = hostname if hostname is not None else socket.gethostname()
    if "." not in host:
        host = f"{host}.localdomain"
    defaults = {name: p.default for name, p in PARAMS.items()}
    defaults["myhostname"] = host
    defaults["mydomain"] = _domain_of(host)
    return defaults


class _View:
    """Typed getters over precomputed values; shared by Config and TransportConfig."""

    __slots__ = ()

    config_dir: Path
    _resolved: Mapping[str, Resolved]

    def _get(self, name: str, kind: ParamType | None) -> Resolved:
        try:
            resolved = self._resolved[name]
        except KeyError:
            raise InvariantError(f"unknown configuration parameter: {name}") from None
        if kind is not None and resolved.param.type is not kind:
            raise InvariantError(
                f"parameter {name} is a {resolved.param.type.value}, not a {kind.value}"
            )
        return resolved

    def get_str(self, name: str) -> str:
        """The $name-expanded value as a string (any parameter type)."""
        return self._get(name, None).text

    def get_int(self, name: str) -> int:
        """An integer parameter."""
        value = self._get(name, ParamType.INT).value
        assert isinstance(value, int)
        return value

    def get_time(self, name: str) -> int:
        """A time parameter in seconds; ``bounce_queue_lifetime`` is clamped (module doc)."""
        resolved = self._get(name, ParamType.TIME)
        assert isinstance(resolved.value, int)
        if resolved.param.at_most is not None:
            return min(resolved.value, self.get_time(resolved.param.at_most))
        return resolved.value

    def get_bool(self, name: str) -> bool:
        """A yes/no parameter."""
        value = self._get(name, ParamType.BOOL).value
        assert isinstance(value, bool)
        return value

    def get_list(self, name: str) -> tuple[str, ...]:
        """A list parameter, split on commas and whitespace."""
        value = self._get(name, ParamType.LIST).value
        assert isinstance(value, tuple)
        return value

    def get_path(self, name: str) -> Path:
        """A string parameter as a path; a relative one is relative to the config directory."""
        text = self._get(name, ParamType.STR).text
        if not text:
            raise ConfigError(f"parameter {name} is empty, but a path is needed")
        return Path(os.path.normpath(self.config_dir / text))

    def get_optional_path(self, name: str) -> Path | None:
        """Like `get_path`, but None when the value is empty (``maillog_file``)."""
        return self.get_path(name) if self._get(name, ParamType.STR).text else None

    def get_hostports(self, name: str) -> tuple[tuple[str, int], ...]:
        """A host:port parameter (list or single string) as (host, port) pairs.

        ``[::1]:25`` gives ``("::1", 25)``; ``*:25`` gives ``("", 25)`` (all
        addresses). An empty string parameter gives ``()``.
        """
        resolved = self._get(name, None)
        items = resolved.value if isinstance(resolved.value, tuple) else (resolved.text,)
        return tuple(parse_hostport(item) for item in items if item)


@dataclass(frozen=True, slots=True)
class TransportConfig(_View):
    """Parameters as one master.cf service sees them (its ``-o`` settings on top)."""

    name: str
    entry: MasterEntry
    config_dir: Path
    _resolved: Mapping[str, Resolved]


@dataclass(frozen=True, slots=True)
class Config(_View):
    """The whole configuration, parsed, expanded and checked once."""

    config_dir: Path
    main_settings: Mapping[str, Setting]  # main.cf as written (postconf -n)
    defaults: Mapping[str, str]  # table defaults, host-dependent ones computed
    master: Mapping[str, MasterEntry]  # non-inet master.cf services by name (the transports)
    inet_services: tuple[MasterEntry, ...]  # master.cf inet entries (the listeners)
    warnings: tuple[str, ...]
    _resolved: Mapping[str, Resolved]
    _transports: Mapping[str, TransportConfig]
    refused: tuple[str, ...] = ()  # Postfix parameters qmgrd cannot honour (strict=False only)
    inet_views: tuple[TransportConfig, ...] = ()  # inet_services with their -o settings on top

    def transport(self, name: str) -> TransportConfig:
        """The view for master.cf service ``name``; ConfigError if there is no such service."""
        try:
            return self._transports[name]
        except KeyError:
            raise ConfigError(
                f"{self.config_dir / MASTER_CF}: no service named {name!r}"
            ) from None

    def raw(self, name: str) -> str | None:
        """The value as written in main.cf, else the default, unexpanded; None if undefined."""
        if name in self.main_settings:
            return self.main_settings[name].value
        if name in self.defaults:
            return self.defaults[name]
        split = split_transport_name(name, frozenset(self.master))
        if split is not None:
            return f"${split[1].name}"
        return None


def _param_for(name: str, services: frozenset[str]) -> Param | None:
    param = PARAMS.get(name)
    if param is not None:
        return param
    split = split_transport_name(name, services)
    return split[1] if split is not None else None


def _resolve(layers: Layers, name: str, param: Param) -> Resolved:
    """Expand and convert one parameter, or raise ConfigError saying where it is set."""
    raw = layers.raw(name)
    text = layers.expand(name)
    try:
        value = convert(param, text)
    except ValueError as exc:
        if raw is not None and raw.setting is not None:
            where = raw.setting.where
            shown = raw.setting.value
            expanded = "" if shown == text else f" (expands to {text!r})"
            raise ConfigError(
                f"{where}: parameter {raw.setting.name}: bad value {shown!r}{expanded}: {exc}"
            ) from None
        raise ConfigError(f"parameter {name}: bad value {text!r}: {exc}") from None
    return Resolved(param, text.strip(), value)


def _resolve_view(
    layers: Layers, first: Iterable[Setting], services: frozenset[str], extra: Iterable[str]
) -> dict[str, Resolved]:
    """Resolve the settings in ``first`` (in file order), then every table name and ``extra``."""
    out: dict[str, Resolved] = {}
    for setting in sorted(first, key=lambda s: (str(s.file), s.line)):
        param = _param_for(setting.name, services)
        out[setting.name] = _resolve(layers, setting.name, param or _user_param(setting.name))
    for name in [*PARAMS, *extra]:
        if name not in out:
            param = _param_for(name, services)
            assert param is not None
            out[name] = _resolve(layers, name, param)
    return out


def _unknown_settings(
    settings: Iterable[Setting], services: frozenset[str], referenced: set[str]
) -> tuple[list[str], list[str]]:
    """(warnings, refusals) for settings of names not in qmgrd's table (`qmgrd.config.postfix`)."""
    warnings: list[str] = []
    refused: list[str] = []
    for s in sorted(settings, key=lambda s: (str(s.file), s.line)):
        if is_known(s.name, services):
            continue
        verdict = classify(s.name, s.value)
        if verdict is None:
            if s.name not in referenced:
                warnings.append(f"{s.where}: unused parameter: {s.name}={s.value}")
        elif verdict.kind is Kind.FATAL:
            refused.append(f"{s.where}: parameter {s.name}: {verdict.text}")
        else:
            warnings.append(f"{s.where}: {verdict.text}")
    return warnings, refused


def _check_sanity(cfg_layers: Layers, main: Mapping[str, Setting]) -> None:
    """Cross-parameter rules Postfix enforces at startup (beyond single-value bounds)."""
    if not cfg_layers.expand("queue_directory").strip():
        setting = main.get("queue_directory")
        where = f"{setting.where}: " if setting else ""
        raise ConfigError(f"{where}parameter queue_directory: must not be empty")


def load_config(
    config_dir: Path,
    *,
    hostname: str | None = None,
    main_text: str | None = None,
    strict: bool = True,
) -> Config:
    """Read, expand and check ``config_dir/main.cf`` and ``config_dir/master.cf``.

    ``hostname`` replaces the system host name in the ``myhostname`` default
    (for tests); ``main_text`` replaces main.cf's contents (``postconf -e``
    validates an edit before writing it). Raises ConfigError naming the file,
    the line and the parameter. A Postfix parameter qmgrd cannot honour
    (`qmgrd.config.postfix`) is such an error too, unless ``strict`` is False
    (``postconf``, which must show a configuration it cannot run): it is then
    listed in ``Config.refused``.
    """
    config_dir = Path(os.path.abspath(config_dir))
    main_path, master_path = config_dir / MAIN_CF, config_dir / MASTER_CF
    main = parse_main_cf(main_text if main_text is not None else read_text(main_path), main_path)
    raw_entries = parse_master_cf(read_text(master_path), master_path)
    services = frozenset(e.name for e in raw_entries if e.type != "inet")
    defaults = compute_defaults(hostname)
    if "mydomain" not in main and "myhostname" in main:
        probe = Layers(main, defaults, services)
        if "mydomain" not in references(main["myhostname"].value):
            defaults["mydomain"] = _domain_of(probe.expand("myhostname").strip())

    referenced: set[str] = set()
    for text in [
        *(s.value for s in main.values()),
        *(s.value for e in raw_entries for s in e.overrides.values()),
        *defaults.values(),
    ]:
        referenced |= references(text)

    transport_names = [f"{t}_{suffix}" for t in sorted(services) for suffix in PER_TRANSPORT]
    layers = Layers(main, defaults, services)
    resolved = _resolve_view(layers, main.values(), services, transport_names)
    _check_sanity(layers, main)

    master: dict[str, MasterEntry] = {}
    inet: list[MasterEntry] = []
    inet_views: list[TransportConfig] = []
    views: dict[str, TransportConfig] = {}
    for raw_entry in raw_entries:
        view_layers = Layers(main, defaults, services, overrides=raw_entry.overrides)
        is_inet = raw_entry.type == "inet"
        own = [] if is_inet else [f"{raw_entry.name}_{suffix}" for suffix in PER_TRANSPORT]
        view_resolved = _resolve_view(
            view_layers, [*raw_entry.overrides.values(), *main.values()], services, own
        )
        entry = _master_entry(raw_entry, view_resolved)
        if is_inet:
            inet.append(entry)
            inet_views.append(
                TransportConfig(entry.name, entry, config_dir, MappingProxyType(view_resolved))
            )
            continue
        for suffix, param in PER_TRANSPORT.items():
            full = view_resolved[f"{raw_entry.name}_{suffix}"]
            view_resolved[suffix] = Resolved(param, full.text, full.value)
        master[entry.name] = entry
        views[entry.name] = TransportConfig(
            entry.name, entry, config_dir, MappingProxyType(view_resolved)
        )

    warnings, refused = _unknown_settings(main.values(), services, referenced)
    for raw_entry in raw_entries:
        more_warnings, more_refused = _unknown_settings(
            raw_entry.overrides.values(), services, referenced
        )
        warnings += more_warnings
        refused += more_refused
    if refused and strict:
        more = f" (and {len(refused) - 1} more such parameters)" if len(refused) > 1 else ""
        raise ConfigError(f"{refused[0]}{more}")
    cfg = Config(
        config_dir=config_dir,
        main_settings=MappingProxyType(main),
        defaults=MappingProxyType(defaults),
        master=MappingProxyType(master),
        inet_services=tuple(inet),
        warnings=tuple(warnings),
        _resolved=MappingProxyType(resolved),
        _transports=MappingProxyType(views),
        refused=tuple(refused),
        inet_views=tuple(inet_views),
    )
    from qmgrd.config.validate import check_values  # validate builds on Config: import late

    check_values(cfg)
    return cfg


def _master_entry(raw: RawMasterEntry, view: Mapping[str, Resolved]) -> MasterEntry:
    maxproc = raw.maxproc
    if maxproc is None:
        value = view["default_process_limit"].value
        assert isinstance(value, int)
        maxproc = value
    return MasterEntry(
        name=raw.name,
        type=raw.type,
        maxproc=maxproc,
        command=raw.command,
        overrides=MappingProxyType({n: s.value for n, s in raw.overrides.items()}),
        args=raw.args,
        file=raw.file,
        line=raw.line,
        maxproc_given=raw.maxproc is not None,
    )
