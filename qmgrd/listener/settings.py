"""The listener's settings: a frozen view of the smtpd parameters it needs.

``from_config(cfg)`` reads main.cf's values; ``from_config(cfg, view=...)``
reads a master.cf inet service's view (its ``-o`` settings on top), which is
how ``qmgrd.listener.services`` builds one settings object per listener.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from qmgrd.cleanup import CleanupSettings
from qmgrd.errors import ConfigError, InvariantError
from qmgrd.listener.auth import Credentials, load_password_file
from qmgrd.listener.tls import NO_TLS, TlsSettings, tls_settings
from qmgrd.netaddr import parse_ip
from qmgrd.spool.batchsync import DEFAULT_DIRTY_LIMIT

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_MEMO_SIZE = 4096  # client addresses whose mynetworks answers a settings object keeps


class _ConfigLike(Protocol):
    """The part of ``qmgrd.config.Config`` (or a service view) the listener reads."""

    @property
    def config_dir(self) -> Path: ...

    def get_str(self, name: str) -> str: ...
    def get_bool(self, name: str) -> bool: ...
    def get_path(self, name: str) -> Path: ...
    def get_int(self, name: str) -> int: ...
    def get_time(self, name: str) -> int: ...
    def get_list(self, name: str) -> tuple[str, ...]: ...
    def get_hostports(self, name: str) -> tuple[tuple[str, int], ...]: ...


def parse_networks(items: tuple[str, ...] | list[str]) -> tuple[Network, ...]:
    """Postfix-style mynetworks entries (``127.0.0.0/8``, ``[::1]/128``, bare addresses)."""
    out: list[Network] = []
    for item in items:
        text = item.strip()
        if text.startswith("["):
            close = text.find("]")
            if close < 0:
                raise ConfigError(f"mynetworks: bad entry {item!r}")
            text = text[1:close] + text[close + 1 :]
        try:
            out.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ConfigError(
                f"mynetworks: {item!r} is not a network (host names and files are not supported)"
            ) from None
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    """What the SMTP listener needs to know (Postfix smtpd parameter names)."""

    listen: tuple[tuple[str, int], ...]  # smtpd_listen; port 0 = any free port (tests)
    myhostname: str
    mynetworks: tuple[Network, ...]
    message_size_limit: int  # bytes; 0 = no limit
    smtpd_recipient_limit: int
    smtpd_timeout: float  # seconds
    delay_warning_time: int = 0  # seconds; 0 = no W record
    queue_minfree: int = 0  # spool bytes to keep free (MAIL: 452 4.3.1 below it)
    # queue_syncfs_dirty_limit: the group commit's syncfs bound (qmgrd.spool.batchsync)
    syncfs_dirty_limit: int = DEFAULT_DIRTY_LIMIT
    sasl_credentials: Credentials | None = None  # SMTP AUTH offered when set
    smtpd_banner: str = ""  # text after "220 "; "" = "$myhostname ESMTP qmgrd"
    session_limit: int = 1000  # smtpd_session_limit
    client_connection_limit: int = 50  # smtpd_client_connection_count_limit; 0 = none
    auth_rate_limit: int = 0  # smtpd_client_auth_rate_limit per rate_time_unit; 0 = none
    limit_exceptions: tuple[Network, ...] | None = None  # None = mynetworks
    rate_time_unit: float = 60.0  # anvil_rate_time_unit, seconds
    junk_command_limit: int = 100  # smtpd_junk_command_limit
    hard_error_limit: int = 20  # smtpd_hard_error_limit
    tls: TlsSettings = NO_TLS  # smtpd_tls_*
    service: str = "smtp"  # master.cf service name (logs)
    cleanup: CleanupSettings | None = None  # header processing at DATA; None = store as sent
    # EHLO's reply lines by (STARTTLS offered, AUTH offered), built once (commands._greet).
    # Not an init field: a copy made with dataclasses.replace (e.g. another
    # message_size_limit) starts empty instead of sharing the original's lines.
    ehlo_replies: dict[tuple[bool, bool], tuple[tuple[str, ...], bytes]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    # Answers of permits_relay / limit_exempt by client address (every session asks both;
    # the networks are fixed for these settings). Emptied at _MEMO_SIZE addresses.
    _relay_memo: dict[str, bool] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    _exempt_memo: dict[str, bool] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    # cleanup.is_local_client's answers by (client address, authenticated) (every message
    # asks; the rules, interfaces and networks are fixed for these settings).
    _local_memo: dict[tuple[str, bool], bool] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.smtpd_recipient_limit < 1:
            raise ConfigError("smtpd_recipient_limit must be at least 1")
        if self.message_size_limit < 0:
            raise ConfigError("message_size_limit must not be negative")
        if min(self.session_limit, self.junk_command_limit, self.hard_error_limit) < 1:
            raise ConfigError(
                "smtpd_session_limit, smtpd_junk_command_limit and smtpd_hard_error_limit "
                "must be at least 1"
            )

    @property
    def banner(self) -> str:
        """The greeting text after "220 " (smtpd_banner)."""
        return self.smtpd_banner or f"{self.myhostname} ESMTP qmgrd"

    def limit_exempt(self, addr: str) -> bool:
        """Whether ``addr`` is exempt from the per-client limits (Postfix: mynetworks)."""
        known = self._exempt_memo.get(addr)
        if known is None:
            nets = self.mynetworks if self.limit_exceptions is None else self.limit_exceptions
            known = _remember(self._exempt_memo, addr, _in_networks(addr, nets))
        return known

    @classmethod
    def from_config(
        cls,
        cfg: _ConfigLike,
        *,
        where: dict[str, str] | None = None,
        listen: tuple[tuple[str, int], ...] | None = None,
        session_limit: int | None = None,
        service: str = "smtp",
        cleanup: CleanupSettings | None = None,
    ) -> ListenerSettings:
        """Settings from a configuration or service view; ``where`` prefixes TLS errors;
        ``cleanup`` is the daemon's (CleanupSettings.from_config)."""
        return cls(
            listen=listen if listen is not None else cfg.get_hostports("smtpd_listen"),
            myhostname=cfg.get_str("myhostname"),
            mynetworks=parse_networks(cfg.get_list("mynetworks")),
            message_size_limit=cfg.get_int("message_size_limit"),
            smtpd_recipient_limit=cfg.get_int("smtpd_recipient_limit"),
            smtpd_timeout=float(cfg.get_time("smtpd_timeout")),
            delay_warning_time=cfg.get_time("delay_warning_time"),
            queue_minfree=cfg.get_int("queue_minfree"),
            syncfs_dirty_limit=cfg.get_int("queue_syncfs_dirty_limit"),
            sasl_credentials=_credentials(cfg),
            smtpd_banner=cfg.get_str("smtpd_banner"),
            session_limit=session_limit or cfg.get_int("smtpd_session_limit"),
            client_connection_limit=cfg.get_int("smtpd_client_connection_count_limit"),
            auth_rate_limit=cfg.get_int("smtpd_client_auth_rate_limit"),
            limit_exceptions=parse_networks(cfg.get_list("smtpd_client_event_limit_exceptions")),
            rate_time_unit=float(cfg.get_time("anvil_rate_time_unit")),
            junk_command_limit=cfg.get_int("smtpd_junk_command_limit"),
            hard_error_limit=cfg.get_int("smtpd_hard_error_limit"),
            tls=tls_settings(cfg, where),
            service=service,
            cleanup=cleanup,
        )

    def local_client(self, addr: str, *, sasl: bool) -> bool:
        """``self.cleanup.is_local_client`` for a client of this listener (cleanup is set)."""
        key = (addr, sasl)
        known = self._local_memo.get(key)
        if known is None:
            cleanup = self.cleanup
            if cleanup is None:
                raise InvariantError("local_client without cleanup settings")
            known = cleanup.is_local_client(
                addr,
                interfaces=[host for host, _ in self.listen],
                mynetworks=self.permits_relay,
                sasl_authenticated=sasl,
            )
            if len(self._local_memo) >= _MEMO_SIZE:  # many client addresses: start over
                self._local_memo.clear()
            self._local_memo[key] = known
        return known

    def permits_relay(self, addr: str) -> bool:
        """Whether a client at ``addr`` is inside mynetworks."""
        known = self._relay_memo.get(addr)
        if known is None:
            known = _remember(self._relay_memo, addr, _in_networks(addr, self.mynetworks))
        return known


def _remember(memo: dict[str, bool], addr: str, answer: bool) -> bool:
    if len(memo) >= _MEMO_SIZE:  # many client addresses: start over (bounded memory)
        memo.clear()
    memo[addr] = answer
    return answer


def _in_networks(addr: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = parse_ip(addr.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in networks)


def _credentials(cfg: _ConfigLike) -> Credentials | None:
    if not cfg.get_bool("smtpd_sasl_auth_enable"):
        return None
    if not cfg.get_str("smtpd_sasl_password_file"):
        raise ConfigError("smtpd_sasl_auth_enable = yes needs smtpd_sasl_password_file")
    return load_password_file(cfg.get_path("smtpd_sasl_password_file"))
