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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from qmgrd.errors import ConfigError

TLS_LEVELS = frozenset({"none", "may", "encrypt", "verify"})


class TransportView(Protocol):
    """The part of ``qmgrd.config.TransportConfig`` these settings read."""

    def get_str(self, name: str) -> str: ...
    def get_int(self, name: str) -> int: ...
    def get_time(self, name: str) -> int: ...
    def get_bool(self, name: str) -> bool: ...
    def get_list(self, name: str) -> tuple[str, ...]: ...


@dataclass(frozen=True, slots=True)
class SmtpSettings:
    """Per-transport SMTP client behaviour (Postfix smtp(8) parameter names, prefix dropped)."""

    helo_name: str = "localhost"
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

    def __post_init__(self) -> None:
        """Reject values that would make the client misbehave silently."""
        if self.tls_security_level not in TLS_LEVELS:
            raise ConfigError(
                f"smtp_tls_security_level: unknown level {self.tls_security_level!r} "
                f"(expected one of {', '.join(sorted(TLS_LEVELS))})"
            )
        if self.mx_address_limit < 0 or self.mx_session_limit < 0:
            raise ConfigError("smtp_mx_address_limit / smtp_mx_session_limit must be >= 0")
        if self.connection_reuse_count_limit < 0:
            raise ConfigError("smtp_connection_reuse_count_limit must be >= 0")

    @classmethod
    def from_transport(cls, tv: TransportView) -> SmtpSettings:
        """Build the settings of one master.cf service from its configuration view."""
        return cls(
            helo_name=tv.get_str("smtp_helo_name"),
            dns_nameservers=tv.get_list("smtp_dns_nameservers"),
            tls_security_level=tv.get_str("smtp_tls_security_level") or "none",
            tls_cafile=tv.get_str("smtp_tls_CAfile"),
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
        )
