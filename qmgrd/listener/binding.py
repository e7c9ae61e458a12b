"""Binding the listening sockets: every address of ``smtpd_listen`` or a master.cf service.

``bind_listener(settings)`` returns non-blocking listening sockets for every
address of ``settings.listen`` (each address a host resolves to; IPv6 sockets
are IPv6-only), with a listen backlog of ``_BACKLOG``. The daemon binds once
and serves them in process or hands them to listener worker processes. A bind
failure is a ConfigError naming ``smtpd_listen`` or the service.
"""

from __future__ import annotations

import socket

from qmgrd.errors import ConfigError
from qmgrd.listener.settings import ListenerSettings

__all__ = ["bind_listener"]

# asyncio's default listen backlog (100) overflows when hundreds of clients connect at
# once; the kernel then drops handshakes and clients stall for seconds in SYN retries
# (500 simultaneous clients: 40% still waiting after 20 s). Linux caps it at somaxconn.
_BACKLOG = 1024


def _bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for ``host:port`` (every address it resolves to)."""
    out: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        seen = set()
        for family, kind, proto, _, sockaddr in infos:
            if (family, sockaddr) in seen:
                continue
            seen.add((family, sockaddr))
            sock = socket.socket(family, kind, proto)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(sockaddr)
            sock.listen(_BACKLOG)
            sock.setblocking(False)
    except OSError:
        for sock in out:
            sock.close()
        raise
    return out


def bind_listener(settings: ListenerSettings) -> list[socket.socket]:
    """Listening sockets for every ``settings.listen`` address (to serve here or hand over).

    A bind failure is an operator error: ConfigError naming smtpd_listen (or
    the master.cf service).
    """
    out: list[socket.socket] = []
    for host, port in settings.listen:
        try:
            out += _bind(host, port)
        except OSError as exc:
            for sock in out:
                sock.close()
            what = "smtpd_listen" if settings.service == "smtp" else f"service {settings.service}"
            raise ConfigError(
                f"{what}: cannot listen on {host}:{port}: {exc.strerror or exc}"
            ) from exc
    return out
