"""Value checks beyond the type, run at every start and reload, and the reload guard.

Contract
--------
- `check_values(cfg)` (called by `load_config`) raises a `ConfigError` naming
  the file, the line and the parameter for a value that would otherwise pass
  start and fail later, at delivery time, as an "internal error":

  * host names (``myhostname``, ``mydomain``, ``smtp_helo_name``) must be
    RFC 1123 names (letters, digits, hyphens, underscores, dot-separated
    labels of at most 63 characters, at most 253 in all); ``smtp_helo_name``
    may also be an address literal ``[192.0.2.1]`` / ``[IPv6:2001:db8::1]``;
  * ``relayhost`` and the nexthop of ``default_transport`` are Postfix
    destinations, one or more separated by commas or blanks: ``domain``,
    ``host:port``, ``[host]``, ``[host]:port``, ``[address]:port`` (port a
    number 1..65535 or a service name);
  * ``default_transport`` has a transport name (whether master.cf defines
    it is not checked, as in Postfix: such mail is deferred with "mail
    transport unavailable");
  * host:port parameters (``smtpd_listen``, ``metrics_listen``) use valid host
    names (the port syntax is checked by the type);

  the same checks apply to every master.cf service view (``-o`` overrides).
- `check_reloadable(old, new)` raises ConfigError when a parameter that is
  only read at start (`NOT_RELOADABLE`) differs between the running
  configuration and the new one: a reload must refuse it rather than silently
  keep the old value while the command-line tools already use the new one.
"""

from __future__ import annotations

import ipaddress
import re
import socket

from qmgrd.config.config import Config, TransportConfig
from qmgrd.errors import ConfigError
from qmgrd.log import syslog_name_problem

NOT_RELOADABLE = (
    "queue_directory",
    "smtpd_listen",
    "smtpd_worker_processes",
    "delivery_worker_processes",
    "metrics_listen",
    "maillog_file",
    "log_format",
    "syslog_name",
    "enable_long_queue_ids",
    # cluster: the destination-state connection (qmgrd.destdb)
    "destination_state_backend",
    "destination_state_password",
    "destination_state_timeout",
    "destination_state_lease_ttl",
    "destination_state_fallback_percent",
)
"""Read once at start (spool, bound sockets, log output): a change needs a restart."""

_LABEL_RE = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_SERVICE_RE = re.compile(r"[A-Za-z][A-Za-z0-9-]*")
_ERROR_TRANSPORTS = ("error", "retry")


def hostname_problem(name: str) -> str | None:
    """Why ``name`` is not a valid host name, or None if it is."""
    if not name:
        return "empty host name"
    if any(ch.isspace() for ch in name):
        return "a host name cannot contain white space"
    host = name[:-1] if name.endswith(".") else name
    if len(host) > 253:
        return "host name longer than 253 characters"
    for label in host.split("."):
        if not _LABEL_RE.fullmatch(label):
            return f"bad host name label {label!r}"
    if host.replace(".", "").isdigit():
        return "numeric host name (write an address in brackets: [192.0.2.1])"
    return None


def _literal_problem(text: str) -> str | None:
    inner = text[1:-1]
    if inner.lower().startswith("ipv6:"):
        inner = inner[5:]
    try:
        ipaddress.ip_address(inner)
    except ValueError:
        return f"bad address literal {text!r}"
    return None


def _port_problem(text: str) -> str | None:
    if text.isdigit():
        return None if 0 < int(text) < 65536 else f"bad port {text!r} (expected 1..65535)"
    if not _SERVICE_RE.fullmatch(text):
        return f"bad port {text!r}"
    try:
        socket.getservbyname(text, "tcp")
    except OSError:
        return f"unknown service {text!r}"
    return None


def destination_problem(item: str) -> str | None:
    """Why one nexthop destination is malformed, or None (module doc)."""
    if item.startswith("["):
        close = item.find("]")
        if close < 0:
            return f"missing ']' in {item!r}"
        host, rest = item[1 : close], item[close + 1 :]
        if rest and not rest.startswith(":"):
            return f"text after ']' in {item!r} (expected [host]:port)"
        problem = (
            _literal_problem(item[: close + 1])
            if ":" in host or host.replace(".", "").isdigit()
            else hostname_problem(host)
        )
        return problem or (_port_problem(rest[1:]) if rest else None)
    host, sep, port = item.rpartition(":")
    if not sep:
        return hostname_problem(item)
    if ":" in host:
        return f"write an IPv6 address in brackets: [{host}]:{port}"
    return hostname_problem(host) or _port_problem(port)


def nexthop_problem(text: str) -> str | None:
    """Why a (possibly multi-destination) nexthop is malformed, or None."""
    items = [part for part in text.replace(",", " ").split() if part]
    if not items:
        return "empty nexthop"
    for item in items:
        problem = destination_problem(item)
        if problem:
            return problem
    return None


def _where(view: Config | TransportConfig, name: str) -> str:
    if isinstance(view, TransportConfig) and name in view.entry.overrides:
        return f"{view.entry.file}, line {view.entry.line}: "
    if isinstance(view, Config) and name in view.main_settings:
        return f"{view.main_settings[name].where}: "
    return ""


def _fail(view: Config | TransportConfig, name: str, problem: str) -> ConfigError:
    value = view.get_str(name)
    return ConfigError(f"{_where(view, name)}parameter {name}: bad value {value!r}: {problem}")


def _check_view(view: Config | TransportConfig) -> None:
    for name in ("myhostname", "mydomain"):
        problem = hostname_problem(view.get_str(name))
        if problem:
            raise _fail(view, name, problem)
    helo = view.get_str("smtp_helo_name")
    problem = (
        _literal_problem(helo)
        if helo.startswith("[") and helo.endswith("]")
        else hostname_problem(helo)
    )
    if problem:
        raise _fail(view, "smtp_helo_name", problem)
    relayhost = view.get_str("relayhost")
    if relayhost:
        problem = nexthop_problem(relayhost)
        if problem:
            raise _fail(view, "relayhost", problem)
    transport, _sep, nexthop = view.get_str("default_transport").partition(":")
    transport, nexthop = transport.strip(), nexthop.strip()
    if not transport:
        raise _fail(view, "default_transport", "empty transport (expected transport[:nexthop])")
    if nexthop and transport not in _ERROR_TRANSPORTS:
        problem = nexthop_problem(nexthop)
        if problem:
            raise _fail(view, "default_transport", problem)
    problem = syslog_name_problem(view.get_str("syslog_name"))
    if problem:
        raise _fail(view, "syslog_name", problem)
    for name in ("smtpd_listen", "metrics_listen"):
        for host, _port in view.get_hostports(name):
            problem = None if not host or _is_address(host) else hostname_problem(host)
            if problem:
                raise _fail(view, name, problem)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def check_values(cfg: Config) -> None:
    """Check every value beyond its type, globally and per master.cf service (module doc)."""
    _check_view(cfg)
    for name in cfg.master:
        _check_view(cfg.transport(name))


def check_reloadable(old: Config, new: Config) -> None:
    """ConfigError if a start-only parameter changed between ``old`` and ``new`` (module doc)."""
    for name in NOT_RELOADABLE:
        before, after = old.get_str(name), new.get_str(name)
        if name == "queue_directory":
            before, after = str(old.get_path(name)), str(new.get_path(name))
        if before != after:
            raise ConfigError(
                f"{_where(new, name)}parameter {name} cannot change on reload "
                f"(running with {before!r}, now {after!r}): restart qmgrd to apply it, "
                "or restore the running value"
            )
