"""The parameter table: every configuration parameter, declared once (STYLE §7).

Each `Param` gives a name, a type, the Postfix 3.x default (as postconf -d
prints it: raw, with ``$name`` references unexpanded), bounds, whether a
transport may override it, and a one-line description. `postconf -d`, the
example config and the README's parameter list are generated from this table
(see `describe`).

Per-transport parameters follow Postfix: the table declares the
``default_<suffix>`` name (or, for ``initial_destination_concurrency``, the
bare name) with ``per_transport=True``; a master.cf service ``t`` may then be
given ``t_<suffix>`` in main.cf or with ``-o``. Two such names are declared
explicitly because Postfix declares them with their own defaults:
``local_destination_concurrency_limit`` (2) and ``local_destination_recipient_limit`` (1).

Two defaults depend on the host and are computed when the configuration is
loaded (`Param.computed`): ``myhostname`` and ``mydomain``.

Clamps (``Param.at_most``): ``bounce_queue_lifetime`` is limited to
``maximal_queue_lifetime``, as Postfix does at startup, and
``smtp_connection_cache_time_limit`` to ``connection_cache_ttl_limit``, as
Postfix's scache server does; `Config.get_time` applies them, postconf prints
the value as written.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType


class ParamType(enum.Enum):
    """The value syntax of a parameter."""

    INT = "int"
    TIME = "time"  # a number with an optional unit s m h d w; bare = the parameter's unit
    BOOL = "bool"  # yes | no
    STR = "string"
    LIST = "list"  # separated by commas and/or whitespace


class Check(enum.Enum):
    """An extra syntax check beyond the type (for values whose misuse is common)."""

    NONE = "none"
    HOSTPORT = "hostport"  # host:port, [ipv6]:port; in a list: every element


TIME_UNITS: Mapping[str, int] = MappingProxyType(
    {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
)


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter's declaration; constructing one checks it is self-consistent."""

    name: str
    type: ParamType
    default: str
    description: str
    per_transport: bool = False
    minimum: int | None = None  # INT: the value; TIME: seconds
    maximum: int | None = None
    unit: str = "s"  # TIME only: unit of a bare number
    choices: tuple[str, ...] = ()  # STR only: allowed values ("" allowed only if listed)
    check: Check = Check.NONE
    at_most: str | None = None  # TIME: clamped to this other parameter's value at lookup
    computed: bool = False  # default computed from the host when the config is loaded
    qmgrd_only: bool = False  # not a Postfix parameter

    def __post_init__(self) -> None:
        if self.type is ParamType.TIME and self.unit not in TIME_UNITS:
            raise ValueError(f"{self.name}: bad time unit {self.unit!r}")
        if self.choices and self.type is not ParamType.STR:
            raise ValueError(f"{self.name}: choices only apply to strings")
        if self.per_transport and not (
            self.name.startswith("default_") or self.name == "initial_destination_concurrency"
        ):
            raise ValueError(f"{self.name}: per-transport parameters are default_<suffix> names")

    @property
    def suffix(self) -> str:
        """The part a transport name is prefixed to (``t_<suffix>``); only for per_transport."""
        return self.name.removeprefix("default_")


_I, _T, _B, _S, _L = ParamType.INT, ParamType.TIME, ParamType.BOOL, ParamType.STR, ParamType.LIST
_DAYS_100 = 100 * 86400


_TABLE: tuple[Param, ...] = (
    # --- queue manager: memory and scheduling (notes §12) ---
    Param(
        "qmgr_message_active_limit",
        _I,
        "20000",
        "maximum number of messages in the active queue",
        minimum=1,
    ),
    Param(
        "qmgr_message_recipient_limit",
        _I,
        "20000",
        "in-core recipient budget for first reads; caps the dead-destination cache",
        minimum=1,
    ),
    Param(
        "qmgr_message_recipient_minimum",
        _I,
        "10",
        "baseline in-core recipient limit per message",
        minimum=1,
    ),
    Param(
        "default_recipient_limit",
        _I,
        "20000",
        "recipient slot pool of a transport",
        per_transport=True,
        minimum=1,
    ),
    Param(
        "default_extra_recipient_limit",
        _I,
        "1000",
        "recipient slots reserved for jobs that preempt others",
        per_transport=True,
        minimum=0,
    ),
    Param(
        "default_recipient_refill_limit",
        _I,
        "100",
        "batch size that triggers an opportunistic recipient refill",
        per_transport=True,
        minimum=1,
    ),
    Param(
        "default_recipient_refill_delay",
        _T,
        "5s",
        "age after which a job's recipients are refilled anyway",
        per_transport=True,
        minimum=1,
    ),
    Param(
        "default_delivery_slot_cost",
        _I,
        "5",
        "delivery slots a job must save to preempt; below 2 disables preemption",
        per_transport=True,
        minimum=0,
    ),
    Param(
        "default_delivery_slot_loan",
        _I,
        "3",
        "slots lent to a preempting job",
        per_transport=True,
        minimum=0,
    ),
    Param(
        "default_delivery_slot_discount",
        _I,
        "50",
        "percentage of the slot cost a preempting job must have saved",
        per_transport=True,
        minimum=0,
        maximum=100,
    ),
    Param(
        "default_minimum_delivery_slots",
        _I,
        "3",
        "a job needs this many times the slot cost in entries to be preempted",
        per_transport=True,
        minimum=0,
    ),
    Param(
        "initial_destination_concurrency",
        _I,
        "5",
        "starting concurrency window of a destination",
        per_transport=True,
        minimum=1,
    ),
    Param(
        "default_destination_concurrency_limit",
        _I,
        "20",
        "maximum concurrent deliveries per destination (0 = no limit)",
        per_transport=True,
        minimum=0,
    ),
    Param(
        "local_destination_concurrency_limit",
        _I,
        "2",
        "concurrency limit of the local transport (declared by Postfix)",
        minimum=0,
    ),
    Param(
        "default_destination_recipient_limit",
        _I,
        "50",
        "maximum recipients per delivery request (0 = no limit; 1 = per-recipient queues)",
        per_transport=True,
        minimum=0,
    ),
    Param(
        "local_destination_recipient_limit",
        _I,
        "1",
        "recipient limit of the local transport (declared by Postfix)",
        minimum=0,
    ),
    Param(
        "default_destination_concurrency_positive_feedback",
        _S,
        "1",
        "window increment per delivery without a hop error (N, N/M or N/concurrency)",
        per_transport=True,
    ),
    Param(
        "default_destination_concurrency_negative_feedback",
        _S,
        "1",
        "window decrement per hop error (N, N/M or N/concurrency)",
        per_transport=True,
    ),
    Param(
        "default_destination_concurrency_failed_cohort_limit",
        _I,
        "1",
        "failed pseudo-cohorts before a destination is declared dead (0 = never)",
        per_transport=True,
        minimum=0,
    ),
    # --- learned destination limits (qmgrd only; Scheduler.entry_throttled) ---
    Param(
        "default_destination_concurrency_learning",
        _B,
        "yes",
        "a session refused while others to the destination work means full, not failed: "
        "settle the window, retry the entry when a session frees (no = Postfix)",
        per_transport=True,
        qmgrd_only=True,
    ),
    Param(
        "default_destination_throttle_delay",
        _T,
        "10s",
        "pause after a throttling reply (rate limit, try again later), doubled while it "
        "repeats; past minimal_backoff_time the mail is deferred (0 = defer at once)",
        per_transport=True,
        minimum=0,
        qmgrd_only=True,
    ),
    # --- cluster: destination state shared on Redis (qmgrd.destdb, docs/cluster.md) ---
    Param(
        "destination_state_backend",
        _S,
        "local",
        "where destination state lives: local (this node) or redis://host:port/db, "
        "rediss://host:port/db (TLS), unix:///path?db=N: leases, dead destinations, learned "
        "limits and rates shared by every node using it",
        qmgrd_only=True,
    ),
    Param(
        "destination_state_password",
        _S,
        "",
        "password for the Redis destination state (or put it in the URL)",
        qmgrd_only=True,
    ),
    Param(
        "destination_state_timeout",
        _T,
        "1s",
        "bound on one Redis round trip; past it the node falls back to local limits",
        minimum=1,
        qmgrd_only=True,
    ),
    Param(
        "destination_state_lease_ttl",
        _T,
        "30s",
        "a session's concurrency lease expires this long after its last renewal (renewed "
        "every third of it): a crashed node's sessions stop counting within this time",
        minimum=1,
        qmgrd_only=True,
    ),
    Param(
        "destination_state_fallback_percent",
        _I,
        "100",
        "while Redis is unreachable, this node uses this percentage of each concurrency "
        "limit and rate limit (set 100/N for N nodes)",
        minimum=1,
        maximum=100,
        qmgrd_only=True,
    ),
    Param(
        "default_destination_rate_limit",
        _S,
        "",
        "at most N deliveries per period to one destination (N/period[,max_burst=B], e.g. "
        "600/1m or 600/1m,max_burst=30; empty = none), cluster-wide with a Redis destination "
        "state (GCRA: one every period/N, up to B back to back; B defaults to 1)",
        per_transport=True,
        qmgrd_only=True,
    ),
    # --- end cluster ---
    Param(
        "default_destination_rate_delay",
        _T,
        "0s",
        "pause between deliveries to one destination; forces concurrency 1",
        per_transport=True,
        minimum=0,
    ),
    Param(
        "default_transport_rate_delay",
        _T,
        "0s",
        "pause between deliveries by one transport",
        per_transport=True,
        minimum=0,
    ),
    Param(
        "default_process_limit",
        _I,
        "100",
        "maximum concurrent deliveries of a master.cf service whose maxproc is '-'",
        minimum=1,
    ),
    Param(
        "transport_retry_time", _T, "60s", "time before a dead transport is tried again", minimum=1
    ),
    Param(
        "minimal_backoff_time",
        _T,
        "300s",
        "minimum time between delivery attempts; dead-destination cache time",
        minimum=1,
    ),
    Param("maximal_backoff_time", _T, "4000s", "maximum time between delivery attempts", minimum=1),
    Param("queue_run_delay", _T, "300s", "period of the deferred queue scan", minimum=1),
    Param(
        "maximal_queue_lifetime",
        _T,
        "5d",
        "time a message may stay queued before it bounces (0 = try once)",
        unit="d",
        minimum=0,
        maximum=_DAYS_100,
    ),
    Param(
        "bounce_queue_lifetime",
        _T,
        "5d",
        "queue lifetime of null-sender mail; clamped to maximal_queue_lifetime",
        unit="d",
        minimum=0,
        maximum=_DAYS_100,
        at_most="maximal_queue_lifetime",
    ),
    Param(
        "bounce_size_limit",
        _I,
        "50000",
        "maximal bytes of the original returned in a notice (larger: headers only)",
        minimum=1,
    ),
    Param(
        "delay_warning_time",
        _T,
        "0h",
        "send a delay notice after this time in the queue (0 = never)",
        unit="h",
        minimum=0,
    ),
    Param("defer_transports", _L, "", "transports whose mail is held until a flush"),
    # --- addresses and routing ---
    Param(
        "myhostname",
        _S,
        "",
        "the fully-qualified name of this host (default: from the system)",
        computed=True,
    ),
    Param(
        "mydomain",
        _S,
        "",
        "the domain of this host (default: myhostname minus its first label)",
        computed=True,
    ),
    Param("mail_name", _S, "qmgrd", "the product name in greetings and bounces"),
    # --- cleanup at intake (qmgrd.cleanup) ---
    Param(
        "maildrop_directory",
        _S,
        "$queue_directory/maildrop",
        "where sendmail leaves mail for the daemon's pickup (mode 1730, see README)",
        qmgrd_only=True,
    ),
    Param("myorigin", _S, "$myhostname", "domain appended to unqualified addresses of local mail"),
    Param("append_at_myorigin", _B, "yes", "qualify a bare local part (root) with @$myorigin"),
    Param("append_dot_mydomain", _B, "no", "append .$mydomain to user@host addresses"),
    Param(
        "hopcount_limit",
        _I,
        "50",
        "maximal number of Received: and Delivered-To: headers (554 5.4.0 too many hops)",
        minimum=1,
    ),
    Param(
        "header_size_limit",
        _I,
        "102400",
        "maximal bytes of one message header (the rest of the header is dropped)",
        minimum=1,
    ),
    Param(
        "always_add_missing_headers",
        _B,
        "no",
        "add missing Message-ID, Date, From (and To) to mail from every client",
    ),
    Param(
        "local_header_rewrite_clients",
        _L,
        "permit_inet_interfaces",
        "clients whose mail gets header rewriting and missing headers",
    ),
    Param(
        "undisclosed_recipients_header",
        _S,
        "",
        "header added when a local message has no To: or Cc: (empty = none, as Postfix 2.8+)",
    ),
    Param(
        "message_drop_headers",
        _L,
        "bcc, content-length, resent-bcc, return-path",
        "headers removed from every message at intake",
    ),
    Param("canonical_maps", _L, "", "tables rewriting sender and recipient addresses"),
    Param("sender_canonical_maps", _L, "", "tables rewriting sender addresses"),
    Param("recipient_canonical_maps", _L, "", "tables rewriting recipient addresses"),
    Param(
        "canonical_classes",
        _L,
        "envelope_sender, envelope_recipient, header_sender, header_recipient",
        "what canonical_maps rewrites",
    ),
    Param(
        "sender_canonical_classes",
        _L,
        "envelope_sender, header_sender",
        "what sender_canonical_maps rewrites",
    ),
    Param(
        "recipient_canonical_classes",
        _L,
        "envelope_recipient, header_recipient",
        "what recipient_canonical_maps rewrites",
    ),
    Param("masquerade_domains", _L, "", "domains whose subdomains are stripped (!sub to exclude)"),
    Param("masquerade_exceptions", _L, "", "user names never masqueraded (root, mailer-daemon)"),
    Param(
        "masquerade_classes",
        _L,
        "envelope_sender, header_sender, header_recipient",
        "what masquerade_domains rewrites",
    ),
    Param("smtp_generic_maps", _L, "", "tables rewriting addresses on the way out (generic(5))"),
    Param("smtp_header_checks", _L, "", "regexp:/pcre: tables applied to headers on the way out"),
    Param("header_checks", _L, "", "regexp:/pcre: tables applied to each header at intake"),
    Param("relayhost", _S, "", "next-hop for non-local mail (empty = direct MX delivery)"),
    Param("default_transport", _S, "smtp", "transport for destinations not in transport_maps"),
    Param("transport_maps", _L, "", "tables mapping recipients to transport:nexthop"),
    Param(
        "sender_dependent_relayhost_maps",
        _L,
        "",
        "tables of relayhost by sender address or @domain",
    ),
    Param("fallback_relay", _L, "", "obsolete name of smtp_fallback_relay"),
    Param("recipient_delimiter", _S, "", "characters that separate a user name from an extension"),
    Param("soft_bounce", _B, "no", "turn permanent (5xx) failures into deferrals"),
    Param(
        "double_bounce_sender", _S, "double-bounce", "sender of postmaster notices (never bounced)"
    ),
    # --- SMTP client ---
    Param(
        "smtp_fallback_relay",
        _L,
        "$fallback_relay",
        "destinations tried when the nexthop is unreachable or not found",
    ),
    Param("smtp_helo_name", _S, "$myhostname", "host name sent in EHLO/HELO"),
    Param(
        "smtp_tls_security_level",
        _S,
        "",
        "TLS policy: none (or empty), may, encrypt, verify, secure (dane: not supported)",
        choices=("", "none", "may", "encrypt", "verify", "secure"),
    ),
    Param("smtp_tls_CAfile", _S, "", "file of trusted CA certificates (empty = system store)"),
    Param("smtp_tls_connection_reuse", _B, "no", "allow reuse of TLS-protected connections"),
    Param(
        "smtp_dns_nameservers",
        _L,
        "",
        "DNS servers to query (empty = system resolver)",
        qmgrd_only=True,
    ),
    Param("smtp_connect_timeout", _T, "30s", "time limit for a TCP connection", minimum=0),
    Param("smtp_helo_timeout", _T, "300s", "time limit for the greeting and EHLO/HELO", minimum=1),
    Param("smtp_mail_timeout", _T, "300s", "time limit for the MAIL FROM reply", minimum=1),
    Param("smtp_rcpt_timeout", _T, "300s", "time limit for a RCPT TO reply", minimum=1),
    Param("smtp_data_init_timeout", _T, "120s", "time limit for the DATA reply", minimum=1),
    Param(
        "smtp_data_xfer_timeout", _T, "180s", "time limit for sending one content chunk", minimum=1
    ),
    Param(
        "smtp_data_done_timeout",
        _T,
        "600s",
        "time limit for the reply after the final dot",
        minimum=1,
    ),
    Param("smtp_quit_timeout", _T, "300s", "time limit for the QUIT reply", minimum=1),
    Param(
        "smtp_rset_timeout",
        _T,
        "20s",
        "time limit for RSET when probing a cached connection",
        minimum=1,
    ),
    Param("smtp_starttls_timeout", _T, "300s", "time limit for the TLS handshake", minimum=1),
    Param(
        "smtp_mx_address_limit", _I, "5", "addresses tried per next-hop (0 = no limit)", minimum=0
    ),
    Param(
        "smtp_mx_session_limit",
        _I,
        "2",
        "completed handshakes per next-hop (0 = no limit)",
        minimum=0,
    ),
    Param("smtp_randomize_addresses", _B, "yes", "shuffle addresses of equal preference"),
    Param("smtp_balance_inet_protocols", _B, "yes", "mix IPv4 and IPv6 within the address limit"),
    Param(
        "smtp_address_preference",
        _S,
        "any",
        "address family preferred at equal MX preference",
        choices=("any", "ipv4", "ipv6"),
    ),
    Param("smtp_skip_5xx_greeting", _B, "yes", "try the next MX host after a 5xx greeting"),
    Param(
        "smtp_defer_if_no_mx_address_found",
        _B,
        "no",
        "defer, rather than bounce, when no MX host has an address",
    ),
    Param("ignore_mx_lookup_error", _B, "no", "look up A records when the MX lookup fails"),
    # --- SMTP client: ending a session (issue 14, delivery CPU; qmgrd.delivery.conversation) ---
    Param(
        "smtp_skip_quit_response",
        _B,
        "yes",
        "do not wait for the response to the SMTP QUIT command",
    ),
    # --- SMTP client: AUTH, TLS policy, routing (issue 11) ---
    Param("smtp_sasl_auth_enable", _B, "no", "authenticate to servers that offer AUTH"),
    Param(
        "smtp_sasl_password_maps",
        _L,
        "",
        "tables of username:password by sender, [host]:port, [host], host or domain",
    ),
    Param(
        "smtp_sasl_security_options",
        _L,
        "noplaintext, noanonymous",
        "SASL mechanism restrictions without TLS",
    ),
    Param(
        "smtp_sasl_tls_security_options",
        _L,
        "$smtp_sasl_security_options",
        "SASL mechanism restrictions over TLS",
    ),
    Param(
        "smtp_sasl_mechanism_filter", _L, "", "mechanisms the client may use (empty = all)"
    ),
    Param(
        "smtp_sender_dependent_authentication",
        _B,
        "no",
        "look up SASL credentials by sender address first",
    ),
    Param(
        "smtp_sasl_auth_soft_bounce",
        _B,
        "yes",
        "defer, rather than bounce, when AUTH is rejected with 5xx",
    ),
    Param("smtp_tls_CApath", _S, "", "directory of trusted CA certificates"),
    Param(
        "smtp_tls_verify_cert_match",
        _L,
        "hostname",
        "certificate names accepted at level verify",
    ),
    Param(
        "smtp_tls_secure_cert_match",
        _L,
        "nexthop, dot-nexthop",
        "certificate names accepted at level secure",
    ),
    Param(
        "smtp_tls_mandatory_protocols",
        _S,
        ">=TLSv1",
        "TLS protocols allowed at levels encrypt and stronger",
    ),
    Param("smtp_tls_wrappermode", _B, "no", "TLS from the first byte (SMTPS, port 465)"),
    Param("smtp_tls_policy_maps", _L, "", "tables of per-destination TLS policy"),
    Param(
        "smtp_tls_loglevel",
        _I,
        "0",
        "1 = log each TLS connection (Verified/Trusted/Untrusted/Anonymous)",
        minimum=0,
    ),
    Param("smtp_bind_address", _S, "", "local IPv4 address for outgoing connections"),
    Param("smtp_bind_address6", _S, "", "local IPv6 address for outgoing connections"),
    Param(
        "smtp_connection_cache_on_demand",
        _B,
        "yes",
        "cache connections to destinations with a backlog",
    ),
    Param(
        "smtp_connection_cache_destinations",
        _L,
        "",
        "destinations whose connections are always cached",
    ),
    Param(
        "smtp_connection_cache_time_limit",
        _T,
        "2s",
        "idle time of a cached connection; clamped to connection_cache_ttl_limit",
        minimum=1,
        at_most="connection_cache_ttl_limit",
    ),
    Param(
        "smtp_connection_reuse_time_limit",
        _T,
        "300s",
        "maximum age of a reused connection",
        minimum=1,
    ),
    Param(
        "smtp_connection_reuse_count_limit",
        _I,
        "0",
        "maximum reuses of one connection (0 = no limit)",
        minimum=0,
    ),
    Param(
        "connection_cache_ttl_limit",
        _T,
        "2s",
        "upper bound on a cached connection's idle time",
        minimum=1,
    ),
    # --- SMTP listener ---
    Param(
        "smtpd_listen",
        _L,
        "127.0.0.1:25",
        "addresses (host:port) the SMTP listener binds",
        check=Check.HOSTPORT,
        qmgrd_only=True,
    ),
    Param(
        "mynetworks",
        _L,
        "127.0.0.0/8 [::1]/128",
        "client networks allowed to relay (qmgrd default: loopback only)",
    ),
    Param(
        "message_size_limit",
        _I,
        "10240000",
        "maximum message size in bytes (0 = no limit)",
        minimum=0,
    ),
    Param("smtpd_recipient_limit", _I, "1000", "maximum recipients per message", minimum=1),
    Param("smtpd_timeout", _T, "300s", "time limit for a client command or data", minimum=1),
    Param("smtpd_banner", _S, "$myhostname ESMTP $mail_name", "text after 220 in the greeting"),
    Param(
        "smtpd_sasl_auth_enable",
        _B,
        "no",
        "offer SMTP AUTH PLAIN/LOGIN (over TLS, or to loopback clients)",
    ),
    Param(
        "smtpd_sasl_password_file",
        _S,
        "",
        "user:hash lines for SMTP AUTH (python -m qmgrd.listener.auth hash)",
        qmgrd_only=True,
    ),
    Param(
        "queue_minfree",
        _I,
        "0",
        "free spool bytes to keep; MAIL gets 452 4.3.1 when a message would not fit",
        minimum=0,
    ),
    Param(
        "queue_syncfs_dirty_limit",
        _I,
        "67108864",
        "accepted mail is made durable by one syncfs(2) of the queue file system per commit "
        "batch while the system's dirty page cache is at most this many bytes (Linux 5.8 or "
        "later), else by an fsync per queue file as Postfix does (0 = always fsync per file)",
        minimum=0,
        qmgrd_only=True,
    ),
    # --- SMTP listener: TLS (issue 11) ---
    Param(
        "smtpd_tls_security_level",
        _S,
        "",
        "listener TLS: none (or empty), may (offer STARTTLS), encrypt (require it)",
        choices=("", "none", "may", "encrypt"),
    ),
    Param("smtpd_tls_cert_file", _S, "", "PEM certificate (and chain) of the listener"),
    Param("smtpd_tls_key_file", _S, "$smtpd_tls_cert_file", "PEM private key of the listener"),
    Param(
        "smtpd_tls_chain_files",
        _L,
        "",
        "PEM files each with a key then its certificate chain (instead of cert/key files)",
    ),
    Param("smtpd_tls_wrappermode", _B, "no", "TLS from the first byte (SMTPS, port 465)"),
    Param("smtpd_tls_auth_only", _B, "no", "offer AUTH only over TLS, loopback clients too"),
    Param("smtpd_tls_protocols", _S, ">=TLSv1", "TLS protocols allowed at level may"),
    Param(
        "smtpd_tls_mandatory_protocols",
        _S,
        ">=TLSv1",
        "TLS protocols allowed at level encrypt and in wrapper mode",
    ),
    # --- SMTP listener: client limits (Postfix's anvil and error counters) ---
    Param(
        "smtpd_session_limit",
        _I,
        "1000",
        "maximum concurrent SMTP sessions; more get 421 4.3.2 (Postfix: smtpd maxproc)",
        minimum=1,
        qmgrd_only=True,
    ),
    Param(
        "smtpd_client_connection_count_limit",
        _I,
        "50",
        "maximum concurrent sessions per client address; more get 421 4.7.0 (0 = no limit)",
        minimum=0,
    ),
    Param(
        "smtpd_client_auth_rate_limit",
        _I,
        "0",
        "maximum AUTH commands per client per anvil_rate_time_unit (0 = no limit)",
        minimum=0,
    ),
    Param(
        "smtpd_client_event_limit_exceptions",
        _L,
        "$mynetworks",
        "client networks exempt from the connection count and AUTH rate limits",
    ),
    Param("anvil_rate_time_unit", _T, "60s", "time unit of the client rate limits", minimum=1),
    Param(
        "smtpd_junk_command_limit",
        _I,
        "100",
        "NOOP/VRFY/ETRN/RSET commands before each one counts as an error",
        minimum=1,
    ),
    Param(
        "smtpd_hard_error_limit",
        _I,
        "20",
        "errors in a session before it is ended with 421 4.7.0 too many errors",
        minimum=1,
    ),
    # --- intake regulation (regulator: qmgrd.listener.inflow, qmgrd.daemon.intakeflow) ---
    Param(
        "in_flow_delay",
        _T,
        "1s",
        "time to pause before accepting a new message when the message arrival rate exceeds "
        "the rate at which the queue manager takes mail in (0 = off)",
        minimum=0,
        maximum=10,
    ),
    Param(
        "in_flow_backlog_limit",
        _I,
        "0",
        "messages the queue manager holds (active plus waiting to be loaded) at which new "
        "SMTP sessions and MAIL get 421 4.3.2 Service currently unavailable (0 = no limit, "
        "as Postfix; 1000 suits a relay with a host of its own)",
        minimum=0,
        qmgrd_only=True,
    ),
    Param(
        "in_flow_lag_limit",
        _I,
        "0",
        "event-loop lag in milliseconds (moving average over 0.1 s) above which new SMTP "
        "sessions and MAIL get 421 4.3.2 Service currently unavailable; the learned session "
        "cap steers each 0.1 s window's worst lag to half of it (0 = off, as Postfix; 50 "
        "suits a relay with a host of its own)",
        minimum=0,
        qmgrd_only=True,
    ),
    # --- spool, logging, process ---
    Param(
        "queue_directory",
        _S,
        "/var/spool/qmgrd",
        "spool directory (relative to the config directory)",
    ),
    Param(
        "enable_long_queue_ids",
        _B,
        "no",
        "new queue ids in Postfix's long format (base 52, never reused) instead of short hex;"
        " read at start",
    ),
    Param(
        "maillog_file",
        _S,
        "",
        "log file (empty = the journal under systemd, else /dev/log or standard output)",
    ),
    Param(
        "syslog_name",
        _S,
        "qmgrd",
        "program name of log lines, as syslog_name/component (qmgrd/smtpd, qmgrd/smtp, ...)",
    ),
    Param(
        "log_format",
        _S,
        "postfix",
        "log line format: postfix or json",
        choices=("postfix", "json"),
        qmgrd_only=True,
    ),
    Param(
        "shutdown_timeout",
        _T,
        "30s",
        "time deliveries in progress get to finish at stop",
        minimum=0,
        qmgrd_only=True,
    ),
    Param(
        "metrics_listen",
        _S,
        "",
        "host:port of the metrics endpoint (empty = off)",
        check=Check.HOSTPORT,
        qmgrd_only=True,
    ),
    # --- listener worker processes (qmgrd.daemon.workers, docs/processes.md) ---
    Param(
        "smtpd_worker_processes",
        _S,
        "auto",
        "SMTP listener processes sharing the listening sockets (auto = one per CPU core, "
        "os.cpu_count(); 0 or 1 = the listener runs in the queue manager's process); "
        "changes need a restart",
        qmgrd_only=True,
    ),
    # --- delivery worker processes (qmgrd.daemon.dpool, .delivery; docs/processes.md) ---
    Param(
        "delivery_worker_processes",
        _I,
        "0",
        "SMTP delivery agent processes the queue manager hands deliveries to, entries of one "
        "nexthop to the same process (0 = the agents run in the queue manager's process); "
        "changes need a restart",
        minimum=0,
        maximum=256,
        qmgrd_only=True,
    ),
    # --- fair queuing between flows (qmgrd only; qmgrd.daemon.flows, qmgrd.core.fairq) ---
    Param(
        "default_fairness_key",
        _S,
        "none",
        "what makes a message's flow for fair queuing: none (Postfix's FIFO with preemption), "
        "sender_domain, sender, sasl_username or client_address",
        per_transport=True,
        choices=("none", "sender_domain", "sender", "sasl_username", "client_address"),
        qmgrd_only=True,
    ),
    Param(
        "fairness_weight_maps",
        _L,
        "",
        "lookup tables mapping a flow key to 'WEIGHT [TENANT]' (default weight 1; keys with "
        "the same tenant share one flow)",
        qmgrd_only=True,
    ),
    Param(
        "fairness_queue_count",
        _I,
        "64",
        "fair queues per transport that flows are shuffle-sharded onto (bounds the state "
        "hostile senders can create)",
        minimum=1,
        maximum=4096,
        qmgrd_only=True,
    ),
    Param(
        "fairness_hand_size",
        _I,
        "8",
        "fair queues dealt to each flow, of which it takes the least loaded (at most "
        "fairness_queue_count)",
        minimum=1,
        maximum=4096,
        qmgrd_only=True,
    ),
    # --- fair admission into the active queue (qmgrd only; qmgrd.core.admission, issue 15) ---
    Param(
        "qmgr_flow_active_limit",
        _I,
        "0",
        "maximum messages of one fairness flow in the active queue (0 = no limit)",
        minimum=0,
        qmgrd_only=True,
    ),
    Param(
        "qmgr_flow_message_rate_limit",
        _I,
        "0",
        "maximum messages of one fairness flow entering the active queue per "
        "qmgr_flow_rate_time_unit, at most that many back to back (0 = no limit)",
        minimum=0,
        qmgrd_only=True,
    ),
    Param(
        "qmgr_flow_rate_time_unit",
        _T,
        "60s",
        "the time unit of qmgr_flow_message_rate_limit",
        minimum=1,
        qmgrd_only=True,
    ),
    Param(
        "qmgr_flow_backlog_limit",
        _I,
        "0",
        "SMTP intake answers 452 4.3.2 at MAIL FROM to a fairness flow with this many "
        "messages waiting for the active queue (0 = no limit)",
        minimum=0,
        qmgrd_only=True,
    ),
    # --- lookup tables (qmgrd.tables) ---
    Param(
        "parent_domain_matches_subdomains",
        _L,
        "debug_peer_list,fast_flush_domains,mynetworks,permit_mx_backup_networks,"
        "qmqpd_authorized_clients,relay_domains,smtpd_access_maps",
        "features (of those qmgrd has: transport_maps) where 'example.com' also matches "
        "its subdomains, not only '.example.com'",
    ),
)

PARAMS: Mapping[str, Param] = MappingProxyType({p.name: p for p in _TABLE})
"""Every declared parameter by name."""

if len(PARAMS) != len(_TABLE):  # pragma: no cover - a duplicate is a bug in this file
    raise ValueError("duplicate parameter name in the parameter table")

PER_TRANSPORT: Mapping[str, Param] = MappingProxyType(
    {p.suffix: p for p in _TABLE if p.per_transport}
)
"""Per-transport parameters by suffix (``destination_concurrency_limit`` -> its default_ Param)."""


def find_param(name: str) -> Param | None:
    """The declaration of ``name``, or None for a name not in the table."""
    return PARAMS.get(name)


def split_transport_name(name: str, services: frozenset[str] | None) -> tuple[str, Param] | None:
    """Split ``t_<suffix>`` into (t, the default_<suffix> Param), or None.

    With ``services`` given, ``t`` must be one of them (Postfix knows ``t_...``
    names only for master.cf services); with None any prefix is accepted.
    Names in the table are never split (``default_...``, ``local_...``, and
    e.g. ``smtpd_recipient_limit`` are parameters of their own). The longest
    matching suffix wins, so ``x_destination_recipient_limit`` is not read as
    transport ``x_destination`` with suffix ``recipient_limit``.
    """
    if name in PARAMS:
        return None
    best: tuple[str, Param] | None = None
    for suffix, param in PER_TRANSPORT.items():
        tail = "_" + suffix
        if name.endswith(tail) and len(name) > len(tail):
            transport = name[: -len(tail)]
            if services is not None and transport not in services:
                continue
            if best is None or len(param.suffix) > len(best[1].suffix):
                best = (transport, param)
    return best


def describe() -> Iterator[tuple[str, str, str, bool, str]]:
    """Yield (name, type, default, per_transport, description) for docs, sorted by name."""
    for p in sorted(_TABLE, key=lambda q: q.name):
        yield p.name, p.type.value, p.default, p.per_transport, p.description
