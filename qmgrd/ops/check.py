"""``qmgrd check``: load everything the daemon would load, say what would run, fail loudly.

Postfix's ``postfix check`` for qmgrd. :func:`check_command` loads the
configuration as ``qmgrd run`` does (strict: a Postfix parameter qmgrd
cannot honour is an error), then builds every part the daemon builds at
start and every part it would otherwise only open later:

- the delivery agents of master.cf (which load each transport's ``smtp_tls_CAfile`` /
  ``CApath`` now, not at the first TLS connection; errors name the file and line) and each
  transport's scheduler parameters;
- every lookup table (``transport_maps``: the routing the engine would use);
- the listener's settings, including ``smtpd_sasl_password_file``;
- ``maillog_file`` (its directory must exist and be
  writable; nothing is created), ``metrics_listen``;
- the spool: ``queue_directory`` is a directory (or, missing, can be
  created, as ``qmgrd run`` does), belongs to the user running the check (as
  root: a root-owned spool is a warning, since the unit runs the daemon as
  ``qmgrd``), and its queue directories have the same owner; a mode open to
  other users is a warning (``qmgrd run`` tightens it to 0700).

It binds no socket and changes nothing, so it can run next to a running
daemon (before a ``systemctl reload``). Output: what would run on standard
output; each problem on standard error as ``qmgrd: error: <file>, line <n>:
parameter <name>: ...`` (``warning:`` for what the daemon would only warn
about); exit status 0 when there is no error, 1 otherwise.
"""

from __future__ import annotations

import os
import pwd
import ssl
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from qmgrd.cleanup import CleanupSettings
from qmgrd.config import Config, load_config
from qmgrd.config.config import TransportConfig
from qmgrd.config.maps import open_maps, setting_where
from qmgrd.config.params import PARAMS
from qmgrd.daemon.assemble import create_agents
from qmgrd.daemon.destgate import GateSettings
from qmgrd.daemon.dpool import delivery_worker_count
from qmgrd.daemon.settings import (
    delivery_services,
    engine_settings,
    resolver_settings,
    scheduler_params,
    transport_params_fn,
)
from qmgrd.daemon.workers import worker_count
from qmgrd.errors import ConfigError
from qmgrd.listener import ListenerSettings

__all__ = ["check_command", "run_checks"]


@dataclass(slots=True)
class Findings:
    """What a check found: facts (what would run), warnings and errors, in order."""

    facts: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def attempt(self, where: str, step: Callable[[], object]) -> object | None:
        """Run ``step``; an operator error becomes an error line prefixed with ``where``."""
        try:
            return step()
        except (ConfigError, OSError, ValueError, ssl.SSLError) as exc:
            text = str(exc) if isinstance(exc, ConfigError) else _os_text(exc)
            line = f"{where}: {text}" if where else text
            if line not in self.errors:  # one table may be opened by two of the steps
                self.errors.append(line)
            return None


def _os_text(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}" + (f": {exc.filename}" if exc.filename else "")
    return str(exc) or type(exc).__name__


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _check_listener(cfg: Config, found: Findings) -> None:
    # The errors of the password file name it; say where main.cf sets it.
    where = _location(cfg, "smtpd_sasl_password_file") if cfg.get_bool(
        "smtpd_sasl_auth_enable"
    ) else ""
    settings = found.attempt(where, lambda: ListenerSettings.from_config(cfg))
    # header_checks, canonical maps, local_header_rewrite_clients: as the daemon opens them
    found.attempt("", lambda: CleanupSettings.from_config(cfg))
    if not isinstance(settings, ListenerSettings):
        return
    listen = " ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in settings.listen)
    auth = "off"
    if settings.sasl_credentials is not None:
        auth = f"PLAIN LOGIN with {cfg.get_str('smtpd_sasl_password_file')}"
    found.facts.append(
        f"listener: SMTP on {listen}; relaying for mynetworks = "
        f"{' '.join(cfg.get_list('mynetworks'))}; SMTP AUTH {auth}"
    )
    workers = found.attempt("", lambda: worker_count(cfg))
    if isinstance(workers, int):
        found.facts.append(
            f"processes: {workers} SMTP listener processes (qmgrd-smtpd) and the queue manager"
            if workers > 1
            else "processes: one; the SMTP listener runs in the queue manager's process"
        )
    delivery = found.attempt("", lambda: delivery_worker_count(cfg))
    if isinstance(delivery, int) and delivery > 0:
        found.facts.append(f"processes: {delivery} SMTP delivery processes (qmgrd-delivery)")


def _check_transports(cfg: Config, found: Findings) -> None:
    found.attempt("", lambda: create_agents(cfg))
    found.attempt("", lambda: scheduler_params(cfg))
    found.attempt("", lambda: engine_settings(cfg))
    params = transport_params_fn(cfg, found.warnings.append)
    services = delivery_services(cfg)
    # cluster: destination_state_backend and the transports' destination_rate_limit
    found.attempt("", lambda: GateSettings.from_config(cfg, tuple(services)))
    described: list[str] = []
    for name, command in services.items():
        found.attempt("", lambda name=name: params(name))  # type: ignore[misc]
        view = cfg.transport(name)
        entry = cfg.master[name]
        limit = "no process limit" if entry.maxproc == 0 else f"maxproc {entry.maxproc}"
        tls = view.get_str("smtp_tls_security_level") if command == "smtp" else ""
        extra = f", TLS {tls}" if tls and tls != "none" else ""
        described.append(f"{name} ({command}, {limit}{extra})")
    found.facts.append(f"transports: {', '.join(described) or 'none'}")
    relayhost = cfg.get_str("relayhost")
    found.facts.append(
        f"routing: default_transport = {cfg.get_str('default_transport')}; relayhost = "
        + (relayhost or "(empty: MX lookup of each recipient domain)")
    )


def _check_tables(cfg: Config, found: Findings) -> None:
    """Open every table of every ``*_maps`` parameter, in main.cf and in master.cf -o."""
    found.attempt("", lambda: resolver_settings(cfg))  # the routing the engine builds
    shown: list[str] = []
    for name in sorted(n for n in PARAMS if n.endswith("_maps")):
        views: list[Config | TransportConfig] = [cfg]
        views += [
            cfg.transport(service)
            for service, entry in cfg.master.items()
            if name in entry.overrides
        ]
        for view in views:
            found.attempt("", lambda view=view, name=name: open_maps(view, name))  # type: ignore[misc]
            specs = view.get_list(name)
            if specs:
                scope = f" (-o in {view.entry.name})" if isinstance(view, TransportConfig) else ""
                shown.append(f"{name} = {', '.join(specs)}{scope}")
    found.facts.append(f"tables: {'; '.join(shown)}" if shown else "tables: none")


def _check_logs(cfg: Config, found: Findings) -> None:
    name = cfg.get_str("syslog_name")  # checked when the configuration loads
    maillog = cfg.get_optional_path("maillog_file")
    if maillog is None:
        where_to = "the journal under systemd (else /dev/log or standard output)"
    else:
        where_to = str(maillog)
        problem = _maillog_problem(maillog)
        if problem:
            found.errors.append(f"{setting_where(cfg, 'maillog_file')}: {problem}")
    found.facts.append(
        f"logs: {where_to}, as {name}/<component>, format {cfg.get_str('log_format')}"
    )
    metrics = found.attempt(
        setting_where(cfg, "metrics_listen"), lambda: cfg.get_hostports("metrics_listen")
    )
    if isinstance(metrics, tuple):
        shown = " ".join(f"{h}:{p}" for h, p in metrics) or "off"
        found.facts.append(f"metrics: {shown}")


def _location(cfg: Config, name: str) -> str:
    """``file, line N`` where ``name`` is set, or empty (its own message names it)."""
    setting = cfg.main_settings.get(name)
    return setting.where if setting is not None else ""


def _maillog_problem(path: Path) -> str | None:
    if path.exists():
        if path.is_dir():
            return f"{path} is a directory"
        if not os.access(path, os.W_OK):
            return f"cannot write {path}"
        return None
    parent = path.parent
    if not parent.is_dir():
        return f"directory {parent} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create {path}: directory {parent} is not writable"
    return None


def _missing_spool(path: Path, where: str, found: Findings, euid: int) -> None:
    """A missing spool is created at start (mode 0700) if its nearest existing parent allows."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if euid != 0 and not os.access(parent, os.W_OK | os.X_OK):
        found.errors.append(
            f"{where}: {path} does not exist and {_user(euid)} cannot create it in {parent} "
            "(systemd-tmpfiles --create qmgrd.conf creates /var/spool/qmgrd)"
        )
        return
    found.facts.append(f"spool: {path} (missing: qmgrd run creates it, mode 0700)")
    found.warnings.append(
        f"{where}: {path} does not exist; qmgrd run creates it, but under the systemd unit "
        "it must exist first (systemd-tmpfiles --create qmgrd.conf)"
    )


def _check_spool(cfg: Config, found: Findings, euid: int) -> None:
    path = cfg.get_path("queue_directory")
    where = setting_where(cfg, "queue_directory")
    try:
        st = path.stat()
    except FileNotFoundError:
        _missing_spool(path, where, found, euid)
        return
    except OSError as exc:
        found.errors.append(f"{where}: cannot look at {path}: {_os_text(exc)}")
        return
    if not stat.S_ISDIR(st.st_mode):
        found.errors.append(f"{where}: {path} is not a directory")
        return
    mode = stat.S_IMODE(st.st_mode)
    owner = _user(st.st_uid)
    found.facts.append(f"spool: {path} (owner {owner}, mode {mode:04o})")
    if mode & 0o077:
        found.warnings.append(
            f"{where}: {path} is open to other users (mode {mode:04o}); it holds other "
            "people's mail: qmgrd run sets it to 0700"
        )
    if euid == 0:
        if st.st_uid == 0:
            found.warnings.append(
                f"{where}: {path} belongs to root; the systemd unit runs qmgrd as user qmgrd, "
                f"which cannot write it (chown -R qmgrd:qmgrd {path})"
            )
    elif st.st_uid != euid:
        found.errors.append(
            f"{where}: {path} belongs to {owner}, not to {_user(euid)} who runs this check; "
            "the daemon must own its spool"
        )
    elif not os.access(path, os.W_OK | os.X_OK):
        found.errors.append(f"{where}: {path} is not writable by {_user(euid)}")
    try:
        children = sorted(path.iterdir())
    except OSError as exc:
        found.errors.append(f"{where}: cannot list {path}: {_os_text(exc)}")
        return
    for child in children:
        try:
            cst = child.lstat()
        except OSError:
            continue  # removed while we looked
        if stat.S_ISDIR(cst.st_mode) and cst.st_uid != st.st_uid:
            found.errors.append(
                f"{where}: {child} belongs to {_user(cst.st_uid)} but the spool to {owner} "
                f"(chown -R {owner} {path})"
            )


def run_checks(config_dir: Path, *, euid: int | None = None) -> Findings:
    """Everything ``qmgrd check`` looks at (module doc); never raises for an operator error."""
    found = Findings()
    cfg = found.attempt("", lambda: load_config(config_dir))
    if not isinstance(cfg, Config):
        return found
    found.warnings.extend(cfg.warnings)
    found.facts.append(
        f"configuration: {config_dir / 'main.cf'}, {config_dir / 'master.cf'}"
    )
    _check_listener(cfg, found)
    _check_transports(cfg, found)
    _check_tables(cfg, found)
    _check_logs(cfg, found)
    _check_spool(cfg, found, os.geteuid() if euid is None else euid)
    return found


def check_command(config_dir: Path, *, out: TextIO, err: TextIO) -> int:
    """``qmgrd check``: facts on ``out``, problems on ``err``; 0 when nothing is wrong."""
    found = run_checks(config_dir)
    for fact in found.facts:
        out.write(f"{fact}\n")
    out.flush()
    for warning in found.warnings:
        err.write(f"qmgrd: warning: {warning}\n")
    for error in found.errors:
        err.write(f"qmgrd: error: {error}\n")
    if found.errors:
        count = len(found.errors)
        err.write(f"qmgrd: check failed: {count} error{'s' if count > 1 else ''}\n")
        return 1
    out.write("qmgrd: check passed\n")
    return 0
