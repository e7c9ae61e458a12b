"""Which listeners a configuration asks for: smtpd_listen plus master.cf ``inet`` lines.

``listener_settings(cfg)`` returns one ``ListenerSettings`` per listener,
the main one first:

- the main listener binds ``smtpd_listen`` (qmgrd's replacement for
  ``inet_interfaces`` plus the ``smtp`` port). A master.cf line
  ``smtp inet ... smtpd`` (the bare service name, as in Postfix's stock
  master.cf) IS this listener: its ``-o`` settings apply to it and a numeric
  maxproc is its session cap (``-`` keeps ``smtpd_session_limit``);
- every other ``inet`` line starts a listener of its own, as Postfix's
  master does: ``submission inet n - n - - smtpd -o ...`` binds port 587 on
  the hosts of ``smtpd_listen`` (Postfix binds a bare service on
  ``inet_interfaces``); ``0.0.0.0:587 inet ...`` or ``[::]:587`` names the
  address. Its ``-o`` settings apply to that listener only, and its maxproc
  is its session cap (``-`` = ``default_process_limit``; 0 = no cap beyond
  ``smtpd_session_limit``).

Every ConfigError names the file and line of the setting at fault.
"""

from __future__ import annotations

from collections.abc import Mapping

from qmgrd.cleanup import CleanupSettings
from qmgrd.config import Config
from qmgrd.config.config import TransportConfig
from qmgrd.config.files import Setting, inet_endpoint
from qmgrd.errors import ConfigError
from qmgrd.listener.settings import ListenerSettings

_TLS_NAMES = (
    "smtpd_tls_security_level",
    "smtpd_tls_cert_file",
    "smtpd_tls_key_file",
    "smtpd_tls_chain_files",
    "smtpd_tls_wrappermode",
    "smtpd_tls_protocols",
    "smtpd_tls_mandatory_protocols",
)


def _where(main: Mapping[str, Setting], view: TransportConfig | None) -> dict[str, str]:
    """Parameter name -> "file, line N: " where its value is set."""
    out = {n: f"{s.where}: " for n, s in main.items() if n in _TLS_NAMES}
    if view is not None:
        entry = view.entry
        for name in entry.overrides:
            if name in _TLS_NAMES:
                out[name] = f"{entry.file}, line {entry.line}: service {entry.name}: "
    return out


def _is_main(view: TransportConfig) -> bool:
    host, port = inet_endpoint(view.entry.name)
    return host is None and port == 25


def listener_settings(
    cfg: Config, *, cleanup: CleanupSettings | None = None
) -> list[ListenerSettings]:
    """One settings object per listener, the main (smtpd_listen) one first; all share
    ``cleanup`` (the daemon's header processing, ``CleanupSettings.from_config``)."""
    main_view = next((v for v in cfg.inet_views if _is_main(v)), None)
    main_listen = cfg.get_hostports("smtpd_listen")
    if main_view is None:
        first = ListenerSettings.from_config(
            cfg, where=_where(cfg.main_settings, None), cleanup=cleanup
        )
    else:
        first = ListenerSettings.from_config(
            main_view,
            where=_where(cfg.main_settings, main_view),
            listen=main_listen,
            session_limit=main_view.entry.maxproc if main_view.entry.maxproc_given else None,
            cleanup=cleanup,
        )
    out = [first]
    hosts = list(dict.fromkeys(host for host, _ in main_listen)) or ["127.0.0.1"]
    for view in cfg.inet_views:
        if view is main_view:
            continue
        host, port = inet_endpoint(view.entry.name)
        listen = tuple((h, port) for h in hosts) if host is None else ((host, port),)
        try:
            settings = ListenerSettings.from_config(
                view,
                where=_where(cfg.main_settings, view),
                listen=listen,
                session_limit=view.entry.maxproc or None,
                service=view.entry.name,
                cleanup=cleanup,
            )
        except ConfigError as exc:
            text = str(exc)
            if not text.startswith("/"):  # not yet naming a file: name the master.cf line
                entry = view.entry
                text = f"{entry.file}, line {entry.line}: service {entry.name}: {text}"
            raise ConfigError(text) from None
        out.append(settings)
    return out
