"""Opening the lookup tables a ``*_maps`` parameter lists, with errors that say where.

`open_maps(view, name)` splits the parameter's value (commas and blanks,
braces kept together) and opens each table with `qmgrd.tables.open_table`,
relative to the configuration directory. A table that cannot be opened is a
`ConfigError` naming the setting's file and line, the parameter, and the
table's own file and line. `transport_find` builds the transport(5) search
the core's `TransportTable` takes, so the core never reads a file.
"""

from __future__ import annotations

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
