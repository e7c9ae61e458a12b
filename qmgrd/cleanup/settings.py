"""The cleanup parameters, read once from a Config into a frozen `CleanupSettings`.

`CleanupSettings.from_config(cfg)` opens every table (canonical, masquerade
and header_checks; errors name file, line and parameter) and checks
``local_header_rewrite_clients``: qmgrd knows ``permit_inet_interfaces``
(the client's address is a loopback address or one the listener binds,
``smtpd_listen``: qmgrd's listener never binds anything else, so this is
Postfix's meaning), ``permit_mynetworks``, ``permit_sasl_authenticated``,
``static:all`` and ``static:none``; anything else is a ConfigError.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from qmgrd.cleanup.addresses import AddressRewriter, Role
from qmgrd.cleanup.checks import HeaderChecks, open_header_checks
from qmgrd.cleanup.trace import LastDate
from qmgrd.config.config import Config
from qmgrd.config.maps import open_maps, setting_where
from qmgrd.errors import ConfigError
from qmgrd.netaddr import parse_ip

NO_HEADER_CHECKS = HeaderChecks(())
LOCAL_CLIENT_RULES = frozenset(
    {
        "permit_inet_interfaces",
        "permit_mynetworks",
        "permit_sasl_authenticated",
        "static:all",
        "static:none",
    }
)


@dataclass(frozen=True, slots=True)
class CleanupSettings:
    """Everything the header processor and the envelope rewriting need."""

    myhostname: str
    mail_name: str
    rewriter: AddressRewriter
    hopcount_limit: int = 50
    header_size_limit: int = 102400
    always_add_missing_headers: bool = False
    local_header_rewrite_clients: tuple[str, ...] = ("permit_inet_interfaces",)
    undisclosed_recipients_header: str = ""
    drop_headers: frozenset[str] = frozenset({"bcc", "content-length", "resent-bcc", "return-path"})
    header_checks: HeaderChecks = NO_HEADER_CHECKS
    # mail_date of the last second asked (Received:, a missing Date:); not an init field,
    # so a copy made with dataclasses.replace gets its own.
    dates: LastDate = field(default_factory=LastDate, init=False, compare=False, repr=False)

    @classmethod
    def from_config(cls, cfg: Config) -> CleanupSettings:
        """Read and check the parameters; ConfigError naming the setting."""
        rules = cfg.get_list("local_header_rewrite_clients")
        for rule in rules:
            if rule not in LOCAL_CLIENT_RULES:
                raise ConfigError(
                    f"{setting_where(cfg, 'local_header_rewrite_clients')}: unsupported "
                    f"{rule!r} (qmgrd has {', '.join(sorted(LOCAL_CLIENT_RULES))})"
                )
        rewriter = AddressRewriter(
            myorigin=cfg.get_str("myorigin").strip(),
            mydomain=cfg.get_str("mydomain").strip(),
            append_at_myorigin=cfg.get_bool("append_at_myorigin"),
            append_dot_mydomain=cfg.get_bool("append_dot_mydomain"),
            recipient_delimiter=cfg.get_str("recipient_delimiter"),
            canonical_maps=open_maps(cfg, "canonical_maps"),
            sender_canonical_maps=open_maps(cfg, "sender_canonical_maps"),
            recipient_canonical_maps=open_maps(cfg, "recipient_canonical_maps"),
            canonical_classes=_classes(cfg, "canonical_classes"),
            sender_canonical_classes=_classes(cfg, "sender_canonical_classes"),
            recipient_canonical_classes=_classes(cfg, "recipient_canonical_classes"),
            masquerade_domains=cfg.get_list("masquerade_domains"),
            masquerade_exceptions=frozenset(
                e.lower() for e in cfg.get_list("masquerade_exceptions")
            ),
            masquerade_classes=_classes(cfg, "masquerade_classes"),
        )
        return cls(
            myhostname=cfg.get_str("myhostname"),
            mail_name=cfg.get_str("mail_name"),
            rewriter=rewriter,
            hopcount_limit=cfg.get_int("hopcount_limit"),
            header_size_limit=cfg.get_int("header_size_limit"),
            always_add_missing_headers=cfg.get_bool("always_add_missing_headers"),
            local_header_rewrite_clients=rules,
            undisclosed_recipients_header=cfg.get_str("undisclosed_recipients_header").strip(),
            drop_headers=frozenset(h.lower() for h in cfg.get_list("message_drop_headers")),
            header_checks=open_header_checks(
                open_maps(cfg, "header_checks"),
                setting_where(cfg, "header_checks"),
                cfg.config_dir,
            ),
        )

    def is_local_client(
        self,
        client_addr: str | None,
        *,
        interfaces: Collection[str] = (),
        mynetworks: Callable[[str], bool] | None = None,
        sasl_authenticated: bool = False,
    ) -> bool:
        """Whether mail from this client gets header rewriting and missing headers.

        ``client_addr`` None is local submission (sendmail/pickup): always local,
        as in Postfix. ``interfaces`` are the listener's bound addresses.
        """
        if client_addr is None:
            return True
        for rule in self.local_header_rewrite_clients:
            if rule == "static:all":
                return True
            if rule == "permit_inet_interfaces" and (
                _is_loopback(client_addr) or client_addr in interfaces
            ):
                return True
            if rule == "permit_mynetworks" and mynetworks is not None and mynetworks(client_addr):
                return True
            if rule == "permit_sasl_authenticated" and sasl_authenticated:
                return True
        return False


def _is_loopback(addr: str) -> bool:
    try:
        return parse_ip(addr.strip("[]").removeprefix("IPv6:")).is_loopback
    except ValueError:
        return False


def _classes(cfg: Config, name: str) -> frozenset[Role]:
    found: set[Role] = set()
    for word in cfg.get_list(name):
        try:
            found.add(Role(word.lower()))
        except ValueError:
            raise ConfigError(
                f"{setting_where(cfg, name)}: unknown class {word!r} (expected "
                f"{', '.join(r.value for r in Role)})"
            ) from None
    return frozenset(found)
