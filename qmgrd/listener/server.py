"""Binding the SMTP listener on the daemon's own event loop, and stopping it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from qmgrd.errors import ConfigError
from qmgrd.listener.settings import ListenerSettings
from qmgrd.listener.smtpd import SMTPSession
from qmgrd.log import get_logger
from qmgrd.spool import GroupCommitter, Spool

# asyncio's default listen backlog (100) overflows when hundreds of clients connect at
# once; the kernel then drops handshakes and clients stall for seconds in SYN retries
# (500 simultaneous clients: 40% still waiting after 20 s). Linux caps it at somaxconn.
_BACKLOG = 1024


class ListenerHandle:
    """The running listener: its sockets, live sessions and group committer."""

    __slots__ = ("committer", "servers", "sessions", "settings")

    def __init__(
        self,
        servers: list[asyncio.Server],
        sessions: set[SMTPSession],
        committer: GroupCommitter,
        settings: ListenerSettings,
    ) -> None:
        self.servers = servers
        self.sessions = sessions
        self.committer = committer
        self.settings = settings

    def update(self, settings: ListenerSettings) -> None:
        """Reload: new sessions use ``settings`` (mynetworks, limits, timeouts, AUTH).

        Sessions in progress keep the settings they started with. The listen
        addresses are bound once; a changed ``smtpd_listen`` needs a restart.
        """
        if settings.listen != self.settings.listen:
            get_logger("smtpd").warning(
                "smtpd_listen changed; restart qmgrd to listen on the new addresses"
            )
        self.settings = settings

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The bound (host, port) pairs; tests bind port 0 and read the real port here."""
        out = []
        for server in self.servers:
            for sock in server.sockets:
                name = sock.getsockname()
                out.append((str(name[0]), int(name[1])))
        return out

    def close(self) -> None:
        """Stop accepting connections (sessions in progress carry on until wait_closed)."""
        for server in self.servers:
            server.close()

    async def wait_closed(self) -> None:
        """Disconnect the remaining clients and wait for queued commits to finish.

        A message whose commit is already under way still lands in incoming/
        (complete); its client may not see the 250 and may send it again, as
        with Postfix. Nothing partial is ever left behind.
        """
        self.close()
        for session in list(self.sessions):
            if session.transport is not None:
                session.transport.close()
        await self.committer.close()
        for server in self.servers:
            await server.wait_closed()


async def start_listener(
    settings: ListenerSettings,
    spool: Spool,
    *,
    on_commit: Callable[[str], None],
    clock: Callable[[], float] = time.time,
    committer: GroupCommitter | None = None,
) -> ListenerHandle:
    """Bind every ``settings.listen`` address on the running loop and serve SMTP.

    ``on_commit(queue_id)`` runs after each durable commit (the engine's wake-up).
    A bind failure is an operator error: ConfigError naming smtpd_listen.
    """
    loop = asyncio.get_running_loop()
    committer = committer or GroupCommitter(spool)
    sessions: set[SMTPSession] = set()
    servers: list[asyncio.Server] = []
    handle = ListenerHandle(servers, sessions, committer, settings)

    def factory() -> SMTPSession:
        return SMTPSession(handle.settings, committer, on_commit, sessions, clock=clock, loop=loop)

    try:
        for host, port in settings.listen:
            servers.append(await loop.create_server(factory, host, port, backlog=_BACKLOG))
    except OSError as exc:
        for server in servers:
            server.close()
        raise ConfigError(f"smtpd_listen: cannot listen on {host}:{port}: {exc.strerror}") from exc
    get_logger("smtpd").info(
        "listening", addresses=" ".join(f"{h}:{p}" for h, p in handle.addresses)
    )
    return handle
