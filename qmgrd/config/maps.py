"""Opening the lookup tables a ``*_maps`` parameter lists, with errors that say where.

`open_maps(view, name)` splits the parameter's value (commas and blanks,
braces kept together) and opens each table with `qmgrd.tables.open_table`,
relative to the configuration directory. A table that cannot be opened is a
`ConfigError` naming the setting's file and line, the parameter, and the
table's own file and line. `transport_find` builds the transport(5) search
the core's `TransportTable` takes, so the core never reads a file.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from qmgrd.config.config import Config, TransportConfig
from qmgrd.errors import ConfigError
from qmgrd.tables import LookupTable, Order, find_address, open_table


def setting_where(view: Config | TransportConfig, name: str) -> str:
    """``file, line N: parameter NAME`` for a set parameter, else ``parameter NAME``."""
    if isinstance(view, TransportConfig) and name in view.entry.overrides:
        return f"{view.entry.file}, line {view.entry.line}: parameter {name}"
    settings = view.main_settings if isinstance(view, Config) else None
    if settings is not None and name in settings:
        return f"{settings[name].where}: parameter {name}"
    return f"parameter {name}"


def locate_error(cfg: Config, view: TransportConfig, message: str) -> str:
    """``message`` from a settings check, which starts with the parameter it is about
    (``smtp_tls_CAfile: ...``), with where that parameter is set put in front: the
    master.cf line of the service's ``-o`` override, else the main.cf line."""
    match = re.match(r"([a-z][A-Za-z0-9_]*)[:/ ]", message)
    if match is None:
        return message
    name = match.group(1)
    where = setting_where(view if name in view.entry.overrides else cfg, name)
    if where == f"parameter {name}":
        return message
    if message[match.end() - 1] == ":":
        return f"{where}: {message[match.end() :].lstrip()}"
    return f"{where}: {message}"


def open_maps(view: Config | TransportConfig, name: str) -> tuple[LookupTable, ...]:
    """The tables of list parameter ``name``, opened; ConfigError saying where and why."""
    tables: list[LookupTable] = []
    for spec in view.get_list(name):
        try:
            tables.append(open_table(spec, base_dir=view.config_dir))
        except ConfigError as exc:
            raise ConfigError(f"{setting_where(view, name)}: {exc}") from None
    return tuple(tables)


def parent_matches_subdomains(cfg: Config, feature: str) -> bool:
    """Whether ``feature`` is listed in ``parent_domain_matches_subdomains``."""
    return feature in cfg.get_list("parent_domain_matches_subdomains")


def transport_find(cfg: Config) -> Callable[[str, str], str | None] | None:
    """The transport_maps search (transport(5) order) for the core, or None without tables."""
    tables = open_maps(cfg, "transport_maps")
    if not tables:
        return None
    parents = parent_matches_subdomains(cfg, "transport_maps")

    def find(address: str, recipient_delimiter: str) -> str | None:
        return find_address(
            tables,
            address,
            Order.TRANSPORT,
            recipient_delimiter=recipient_delimiter,
            parent_matches_subdomains=parents,
        )

    return find
