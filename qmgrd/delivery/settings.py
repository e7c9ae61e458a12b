"""SMTP client settings: every ``smtp_*`` parameter the delivery agents read.

``SmtpSettings`` is a frozen value built once per transport (STYLE §8) by
``SmtpSettings.from_transport(tv)``, where ``tv`` is the configuration's
per-transport view (``-o`` overrides first, then main.cf, then defaults).
Agents never read the configuration themselves, so tests construct
``SmtpSettings(...)`` directly with the fields they care about.

Defaults are Postfix 3.x's (notes §12). Times are seconds (float, so tests
may use fractions). Two settings are ours: ``smtp_dns_nameservers`` (empty =
the system resolver) and ``dns_timeout`` (the per-query resolver lifetime,
not a configuration parameter: Postfix leaves it to resolv.conf).

Lookup tables (``smtp_sasl_password_maps``, ``smtp_tls_policy_maps``) are
opened by ``from_transport`` (relative paths from the configuration directory),
so a missing or malformed table is a ``ConfigError`` at start or reload.
``warnings`` carries what the agent logs when it is created (a password map
readable by other users).
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from qmgrd.cleanup.checks import open_header_checks
from qmgrd.cleanup.outbound import Outbound
from qmgrd.delivery.mx import parse_nexthop
from qmgrd.delivery.tlspolicy import check_level
from qmgrd.errors import ConfigError
from qmgrd.tables import LookupTable, open_table

ADDRESS_PREFERENCES = ("any", "ipv4", "ipv6")
NO_OUTBOUND = Outbound()


class TransportView(Protocol):
    """The part of ``qmgrd.config.TransportConfig`` these settings read."""

    @property
    def config_dir(self) -> Path: ...

    def get_str(self, name: str) -> str: ...
    def get_int(self, name: str) -> int: ...
    def get_time(self, name: str) -> int: ...
    def get_bool(self, name: str) -> bool: ...
    def get_list(self, name: str) -> tuple[str, ...]: ...


@dataclass(frozen=True, slots=True)
class SmtpSettings:
    """Per-transport SMTP client behaviour (Postfix smtp(8) parameter names, prefix dropped)."""

    helo_name: str = "localhost"
    myhostname: str = ""  # loop test: a server greeting with this name is ourselves ("" = off)
    dns_nameservers: tuple[str, ...] = ()
    dns_timeout: float = 10.0
    tls_security_level: str = "none"
    tls_cafile: str = ""
    tls_connection_reuse: bool = False
    connect_timeout: float = 30.0
    helo_timeout: float = 300.0
    starttls_timeout: float = 300.0
    mail_timeout: float = 300.0
    rcpt_timeout: float = 300.0
    data_init_timeout: float = 120.0
    data_xfer_timeout: float = 180.0
    data_done_timeout: float = 600.0
    rset_timeout: float = 20.0
    quit_timeout: float = 300.0
    skip_quit_response: bool = True  # smtp_skip_quit_response
    mx_address_limit: int = 5
    mx_session_limit: int = 2
    randomize_addresses: bool = True
    skip_5xx_greeting: bool = True
    connection_cache_on_demand: bool = True
    connection_cache_destinations: tuple[str, ...] = ()
    connection_cache_time_limit: float = 2.0
    connection_reuse_time_limit: float = 300.0
    connection_reuse_count_limit: int = 0
    soft_bounce: bool = False
    # TLS (tlspolicy.py)
    tls_capath: str = ""
    tls_verify_cert_match: tuple[str, ...] = ("hostname",)
    tls_secure_cert_match: tuple[str, ...] = ("nexthop", "dot-nexthop")
    tls_mandatory_protocols: str = ">=TLSv1"
    tls_wrappermode: bool = False
    tls_policy_maps: tuple[LookupTable, ...] = ()
    tls_loglevel: int = 0
    # SASL (sasl.py)
    sasl_auth_enable: bool = False
    sasl_password_maps: tuple[LookupTable, ...] = ()
    sasl_security_options: tuple[str, ...] = ("noplaintext", "noanonymous")
    sasl_tls_security_options: tuple[str, ...] | None = None  # None: as sasl_security_options
    sasl_mechanism_filter: tuple[str, ...] = ()
    sender_dependent_authentication: bool = False
    sasl_auth_soft_bounce: bool = True
    # Routing and addresses
    fallback_relay: tuple[str, ...] = ()
    bind_address: str = ""
    bind_address6: str = ""
    address_preference: str = "any"
    balance_inet_protocols: bool = True
    ignore_mx_lookup_error: bool = False
    defer_if_no_mx_address_found: bool = False
    # smtp_generic_maps, smtp_header_checks (qmgrd.cleanup.outbound)
    outbound: Outbound = NO_OUTBOUND
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Reject values that would make the client misbehave silently."""
        check_level(self.tls_security_level, "smtp_tls_security_level")
        if self.tls_wrappermode and self.tls_security_level in ("none", "may"):
            raise ConfigError(
                "smtp_tls_wrappermode = yes requires smtp_tls_security_level = encrypt "
                f"or stronger (it is {self.tls_security_level!r})"
            )
        if not self.helo_name or any(
            ch.isspace() or ord(ch) < 0x21 or ord(ch) >= 0x7F for ch in self.helo_name
        ):
            raise ConfigError(
                f"smtp_helo_name: {self.helo_name!r} is not a host name "
                "(it must be printable ASCII without spaces)"
            )
        if self.address_preference not in ADDRESS_PREFERENCES:
            raise ConfigError(
                f"smtp_address_preference: {self.address_preference!r} "
                f"(expected one of {', '.join(ADDRESS_PREFERENCES)})"
            )
        if self.tls_loglevel < 0:
            raise ConfigError("smtp_tls_loglevel must be >= 0")
        if self.mx_address_limit < 0 or self.mx_session_limit < 0:
            raise ConfigError("smtp_mx_address_limit / smtp_mx_session_limit must be >= 0")
        if self.connection_reuse_count_limit < 0:
            raise ConfigError("smtp_connection_reuse_count_limit must be >= 0")

    @classmethod
    def from_transport(cls, tv: TransportView) -> SmtpSettings:
        """Build the settings of one master.cf service from its configuration view."""
        password_maps = _tables(tv, "smtp_sasl_password_maps")
        return cls(
            helo_name=tv.get_str("smtp_helo_name"),
            myhostname=tv.get_str("myhostname"),
            dns_nameservers=tv.get_list("smtp_dns_nameservers"),
            tls_security_level=tv.get_str("smtp_tls_security_level") or "none",
            tls_cafile=_path(tv, "smtp_tls_CAfile"),
            tls_connection_reuse=tv.get_bool("smtp_tls_connection_reuse"),
            connect_timeout=tv.get_time("smtp_connect_timeout"),
            helo_timeout=tv.get_time("smtp_helo_timeout"),
            starttls_timeout=tv.get_time("smtp_starttls_timeout"),
            mail_timeout=tv.get_time("smtp_mail_timeout"),
            rcpt_timeout=tv.get_time("smtp_rcpt_timeout"),
            data_init_timeout=tv.get_time("smtp_data_init_timeout"),
            data_xfer_timeout=tv.get_time("smtp_data_xfer_timeout"),
            data_done_timeout=tv.get_time("smtp_data_done_timeout"),
            rset_timeout=tv.get_time("smtp_rset_timeout"),
            quit_timeout=tv.get_time("smtp_quit_timeout"),
            skip_quit_response=tv.get_bool("smtp_skip_quit_response"),
            mx_address_limit=tv.get_int("smtp_mx_address_limit"),
            mx_session_limit=tv.get_int("smtp_mx_session_limit"),
            randomize_addresses=tv.get_bool("smtp_randomize_addresses"),
            skip_5xx_greeting=tv.get_bool("smtp_skip_5xx_greeting"),
            connection_cache_on_demand=tv.get_bool("smtp_connection_cache_on_demand"),
            connection_cache_destinations=tv.get_list("smtp_connection_cache_destinations"),
            connection_cache_time_limit=tv.get_time("smtp_connection_cache_time_limit"),
            connection_reuse_time_limit=tv.get_time("smtp_connection_reuse_time_limit"),
            connection_reuse_count_limit=tv.get_int("smtp_connection_reuse_count_limit"),
            soft_bounce=tv.get_bool("soft_bounce"),
            tls_capath=_path(tv, "smtp_tls_CApath"),
            tls_verify_cert_match=tv.get_list("smtp_tls_verify_cert_match"),
            tls_secure_cert_match=tv.get_list("smtp_tls_secure_cert_match"),
            tls_mandatory_protocols=tv.get_str("smtp_tls_mandatory_protocols"),
            tls_wrappermode=tv.get_bool("smtp_tls_wrappermode"),
            tls_policy_maps=_tables(tv, "smtp_tls_policy_maps"),
            tls_loglevel=tv.get_int("smtp_tls_loglevel"),
            sasl_auth_enable=tv.get_bool("smtp_sasl_auth_enable"),
            sasl_password_maps=password_maps,
            sasl_security_options=tv.get_list("smtp_sasl_security_options"),
            sasl_tls_security_options=tv.get_list("smtp_sasl_tls_security_options"),
            sasl_mechanism_filter=tv.get_list("smtp_sasl_mechanism_filter"),
            sender_dependent_authentication=tv.get_bool("smtp_sender_dependent_authentication"),
            sasl_auth_soft_bounce=tv.get_bool("smtp_sasl_auth_soft_bounce"),
            fallback_relay=_fallback_relay(tv),
            bind_address=tv.get_str("smtp_bind_address"),
            bind_address6=tv.get_str("smtp_bind_address6"),
            address_preference=tv.get_str("smtp_address_preference"),
            balance_inet_protocols=tv.get_bool("smtp_balance_inet_protocols"),
            ignore_mx_lookup_error=tv.get_bool("ignore_mx_lookup_error"),
            defer_if_no_mx_address_found=tv.get_bool("smtp_defer_if_no_mx_address_found"),
            outbound=Outbound(
                generic_maps=_tables(tv, "smtp_generic_maps"),
                header_checks=open_header_checks(
                    _tables(tv, "smtp_header_checks"),
                    "smtp_header_checks",
                    tv.config_dir,
                    outbound=True,
                ),
                recipient_delimiter=tv.get_str("recipient_delimiter"),
                header_size_limit=tv.get_int("header_size_limit"),
            ),
            warnings=tuple(_readable_by_others(tv, "smtp_sasl_password_maps")),
        )


def _path(tv: TransportView, name: str) -> str:
    """A file or directory parameter, relative to the configuration directory."""
    text = tv.get_str(name)
    if not text:
        return ""
    path = Path(text)
    return str(path if path.is_absolute() else tv.config_dir / path)


def _tables(tv: TransportView, name: str) -> tuple[LookupTable, ...]:
    """Open every table of a list parameter; ConfigError naming the parameter."""
    tables: list[LookupTable] = []
    for spec in tv.get_list(name):
        try:
            tables.append(open_table(spec, base_dir=tv.config_dir))
        except ConfigError as exc:
            raise ConfigError(f"{name}: {exc}") from None
    return tuple(tables)


def open_lookup(tv: TransportView, name: str) -> Callable[[str], str | None] | None:
    """The tables of list parameter ``name`` as one lookup (first table with the key wins).

    None when the parameter is empty. For the resolver's ``sender_relayhost``
    (``sender_dependent_relayhost_maps``): tables are read here, so the core's calls do no I/O.
    """
    tables = _tables(tv, name)
    if not tables:
        return None

    def lookup(key: str) -> str | None:
        for table in tables:
            found = table.lookup(key)
            if found is not None:
                return found
        return None

    return lookup


def _table_files(tv: TransportView, name: str) -> list[Path]:
    out = []
    for spec in tv.get_list(name):
        kind, _sep, rest = spec.partition(":")
        if kind not in ("inline", "static") and rest:
            path = Path(rest)
            out.append(path if path.is_absolute() else tv.config_dir / path)
    return out


def _readable_by_others(tv: TransportView, name: str) -> list[str]:
    """A warning per table file that users other than the owner and group may read."""
    warnings = []
    for path in _table_files(tv, name):
        try:
            mode = path.stat().st_mode
        except OSError:
            continue
        if mode & stat.S_IROTH:
            warnings.append(
                f"{name}: {path} is readable by other users (mode {stat.S_IMODE(mode):04o}); "
                f"it holds passwords: chmod o-rwx {path}"
            )
    return warnings


def _fallback_relay(tv: TransportView) -> tuple[str, ...]:
    """``smtp_fallback_relay`` (defaults to the obsolete ``fallback_relay``), syntax-checked.

    ``relayhost`` is checked here too: the SMTP agent is what parses it, and a bad one
    would otherwise defer every message at delivery time instead of stopping the start.
    """
    relayhost = tv.get_str("relayhost")
    if relayhost:
        try:
            parse_nexthop(relayhost)
        except ConfigError as exc:
            raise ConfigError(f"relayhost: {exc}") from None
    relays = tv.get_list("smtp_fallback_relay")
    if relays:
        try:
            parse_nexthop(" ".join(relays))
        except ConfigError as exc:
            raise ConfigError(f"smtp_fallback_relay: {exc}") from None
    return relays
