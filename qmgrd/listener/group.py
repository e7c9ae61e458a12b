"""Every SMTP listener of one process: smtpd_listen plus master.cf ``inet`` services.

Contract
--------
``await ListenerGroup.start(settings, spool, on_commit=..., observer=...)``
starts one listener per ``ListenerSettings`` (the main one first, as
``qmgrd.listener.services.listener_settings`` returns them); the others share
the main one's group committer and password pool, and all the ``gate`` (fair
admission's intake check, ``qmgrd.listener.flowgate``) and the main one's
queue file pool (``recycler``: the given one, else a new one). ``sockets`` (service name
-> listening sockets) hands over sockets bound elsewhere: a listener worker
process serves the sockets its parent bound, so every worker accepts on the
same kernel queue. Without it each listener binds its own addresses
(ConfigError naming the setting when it cannot).

``update(settings)`` (SIGHUP): new sessions of each listener use its new
settings; a changed set of inet services is logged (it needs a restart).
``aclose()`` stops accepting, disconnects the remaining clients and waits for
queued commits (``ListenerHandle.wait_closed``), services first.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence

from qmgrd.listener.accepting import ACCEPT_BATCH
from qmgrd.listener.flowgate import NULL_GATE, FlowGate
from qmgrd.listener.observer import NULL_INTAKE, Committed, IntakeObserver
from qmgrd.listener.server import ListenerHandle, start_listener
from qmgrd.listener.settings import ListenerSettings
from qmgrd.log import get_logger
from qmgrd.spool import Spool
from qmgrd.spool.recycle import Recycler

__all__ = ["ListenerGroup"]


class ListenerGroup:
    """The running listeners of one process (see the module doc)."""

    __slots__ = ("main", "services")

    def __init__(self, main: ListenerHandle, services: dict[str, ListenerHandle]) -> None:
        """Use ``start`` to build one."""
        self.main = main
        self.services = services

    @classmethod
    async def start(
        cls,
        settings: Sequence[ListenerSettings],
        spool: Spool,
        *,
        on_commit: Callable[[Committed], None],
        observer: IntakeObserver = NULL_INTAKE,
        gate: FlowGate = NULL_GATE,
        sockets: Mapping[str, Sequence[socket.socket]] | None = None,
        accept_batch: int = ACCEPT_BATCH,
        recycler: Recycler | None = None,
    ) -> ListenerGroup:
        """Start every listener in ``settings`` (module doc); closes what started on failure."""
        main_settings, *others = settings

        def given(service: str) -> Sequence[socket.socket] | None:
            return None if sockets is None else sockets.get(service, ())

        main = await start_listener(
            main_settings,
            spool,
            on_commit=on_commit,
            observer=observer,
            gate=gate,
            sockets=given(main_settings.service),
            accept_batch=accept_batch,
            recycler=recycler,
        )
        group = cls(main, {})
        try:
            for item in others:
                group.services[item.service] = await start_listener(
                    item,
                    spool,
                    on_commit=on_commit,
                    committer=main.committer,
                    passwords=main.ctx.passwords,
                    observer=observer,
                    gate=gate,
                    sockets=given(item.service),
                    accept_batch=accept_batch,
                    recycler=main.ctx.recycler,
                )
        except BaseException:
            await group.aclose()
            raise
        return group

    def update(self, settings: Sequence[ListenerSettings]) -> None:
        """Reload: each listener's new sessions use its new settings (module doc)."""
        main, *others = settings
        self.main.update(main)
        if {s.service for s in others} != set(self.services):
            get_logger("master").warning(
                "master.cf inet services changed; restart qmgrd to start or stop listeners"
            )
        for item in others:
            handle = self.services.get(item.service)
            if handle is not None:
                handle.update(item)

    @property
    def sessions(self) -> int:
        """SMTP sessions in progress over every listener."""
        return len(self.main.sessions) + sum(len(h.sessions) for h in self.services.values())

    async def aclose(self) -> None:
        """Stop accepting and let the sessions end (services first, then the main listener)."""
        for name, handle in list(self.services.items()):
            handle.close()
            await handle.wait_closed()
            del self.services[name]
        self.main.close()
        await self.main.wait_closed()
