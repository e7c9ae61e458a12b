"""Accepting SMTP connections on the daemon's loop: session caps, fd exhaustion, shutdown.

The listener accepts on its own non-blocking listening sockets (a reader
callback on the loop, ``accepting.Acceptor``) so that admission is decided
before a session exists:

- more than ``smtpd_session_limit`` live sessions: the new client gets
  ``421 4.3.2 Service currently unavailable`` and is closed (Postfix's smtpd
  answers so when it cannot serve; its master would leave the client
  waiting at its process limit, which under a flood of idle connections
  means every new client waits); logged with a count, one line a second at
  most (``inflow.RefusalNotes``);
- over capacity (the regulator's gate, ``ListenerContext.inflow``): the same
  reply;
- a client address (outside ``smtpd_client_event_limit_exceptions``, by
  default mynetworks) with ``smtpd_client_connection_count_limit`` live
  sessions: ``421 4.7.0 HOST Error: too many connections from ADDR``, logged
  as Postfix's anvil does ("Connection concurrency limit exceeded"). In a
  listener worker process the count is the queue manager's, over every
  worker (``ListenerContext.anvil``, ``qmgrd.listener.limits.SharedCounts``),
  asked before the session starts.

Accepting itself (batches per wake-up, the hold after a refusal for
capacity, the pause when descriptors run out, the refusal's one ``send``) is
``qmgrd.listener.accepting``.

The cap is also kept within the process's open-file limit: a session may
hold two descriptors (its socket and its queue file), and ``_FD_RESERVE`` are
left for the rest of the daemon (spool work, delivery connections), so with
a soft ``RLIMIT_NOFILE`` of 1024 at most 384 sessions are admitted (logged at
start when that lowers ``smtpd_session_limit``; the systemd unit sets 65536).

Each admitted connection becomes a ``Session`` task (``qmgrd.listener.session``)
with the settings current at accept time; a reload (``update``) applies to
new sessions.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import ssl
import time
from collections.abc import Callable, Sequence

from qmgrd.errors import ConfigError
from qmgrd.listener.accepting import ACCEPT_BATCH, UNAVAILABLE, Acceptor, refuse
from qmgrd.listener.auth import PasswordChecker
from qmgrd.listener.binding import bind_listener
from qmgrd.listener.channel import Channel, Deadlines
from qmgrd.listener.flowgate import NULL_GATE, FlowGate
from qmgrd.listener.inflow import IntakeGate, RefusalNotes
from qmgrd.listener.limits import ClientCounters, SharedCounts
from qmgrd.listener.observer import NULL_INTAKE, Committed, IntakeObserver
from qmgrd.listener.session import ListenerContext, Session
from qmgrd.listener.settings import ListenerSettings
from qmgrd.log import get_logger
from qmgrd.spool import GroupCommitter, Spool
from qmgrd.spool.recycle import Recycler

_READ_LIMIT = 65536  # StreamReader buffer: the transport pauses above twice this
_FD_RESERVE = 256  # descriptors kept for everything but sessions
_CLOSE_WAIT = 10.0  # seconds wait_closed gives sessions to clean up after a disconnect


class ListenerHandle:
    """The running listener: its sockets, live sessions, counters and group committer."""

    __slots__ = (
        "_cap",
        "_deadlines",
        "_fd_cap",
        "_limited",
        "_loop",
        "_tasks",
        "acceptor",
        "committer",
        "ctx",
        "owns_shared",
        "sessions",
        "settings",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        ctx: ListenerContext,
        settings: ListenerSettings,
    ) -> None:
        self._loop = loop
        self._tasks: set[asyncio.Task[None]] = set()
        self.ctx = ctx
        self.committer = ctx.committer
        self.sessions: set[Session] = set()
        self.settings = settings
        self.owns_shared = True  # wait_closed closes the committer and password pool
        self.acceptor = Acceptor(loop, self._admit)
        self._deadlines = Deadlines(loop)  # one timer for every session's read deadline
        self._fd_cap = fd_session_cap(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self._limited = RefusalNotes()  # smtpd_session_limit refusals, logged a second at a time
        self._check_cap(settings)
        self._cap = min(settings.session_limit, self._fd_cap)  # sessions admitted at most

    def _check_cap(self, settings: ListenerSettings) -> None:
        if settings.session_limit > self._fd_cap:
            get_logger("smtpd").warning(
                "smtpd_session_limit lowered to fit the open file limit",
                smtpd_session_limit=settings.session_limit,
                effective=self._fd_cap,
            )

    def update(self, settings: ListenerSettings) -> None:
        """Reload: new sessions use ``settings`` (mynetworks, limits, timeouts, AUTH, banner).

        Sessions in progress keep the settings they started with. The listen
        addresses are bound once; a changed ``smtpd_listen`` needs a restart.
        """
        if settings.listen != self.settings.listen:
            get_logger("smtpd").warning(
                "smtpd_listen changed; restart qmgrd to listen on the new addresses"
            )
        if settings.session_limit != self.settings.session_limit:
            self._check_cap(settings)
        self._cap = min(settings.session_limit, self._fd_cap)
        self.settings = settings

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The bound (host, port) pairs; tests bind port 0 and read the real port here."""
        out = []
        for sock in self.acceptor.sockets:
            if sock.fileno() >= 0:
                name = sock.getsockname()
                out.append((str(name[0]), int(name[1])))
        return out

    def _admit(self, conn: socket.socket, addr: str) -> bool:
        """Start a session for ``conn``, or refuse it; False: refused for lack of capacity."""
        settings = self.settings
        ctx = self.ctx
        counters = ctx.counters
        ctx.observer.connected()
        if counters.total >= self._cap:
            refuse(conn, UNAVAILABLE)
            ctx.observer.rejected("limits")
            self._limited.add()
            if count := self._limited.take():
                get_logger("smtpd").warning(
                    "session limit reached: connection refused",
                    client=f"unknown[{addr}]",
                    smtpd_session_limit=self._cap,
                    count=count,
                )
            return False
        gate = ctx.inflow
        if not gate.admit_session():  # regulator: over capacity (listener.inflow)
            refuse(conn, UNAVAILABLE)
            ctx.observer.rejected("limits")
            if count := gate.note_refusals():
                get_logger("smtpd").warning(
                    "over capacity: connections refused", client=f"unknown[{addr}]", count=count
                )
            return False
        limit = settings.client_connection_limit
        limited = limit > 0 and not settings.limit_exempt(addr)
        anvil = self.ctx.anvil if limited else None
        if limited and anvil is None and counters.sessions(addr) >= limit:
            gate.started()  # admitted by the gate, but ends here
            self._refuse_concurrency(conn, addr, counters.sessions(addr) + 1, settings)
            return True  # that client's limit, not this listener's capacity
        counters.connect(addr)
        # The task leaves _tasks itself as it ends (_session, _ask_anvil): no done callback,
        # whose call_soon costs more than the discard.
        if anvil is None:  # the usual: the session's coroutine is the task's
            self._tasks.add(self._loop.create_task(self._session(conn, addr, settings, gate)))
        else:
            self._tasks.add(
                self._loop.create_task(self._ask_anvil(conn, addr, settings, gate, anvil))
            )
        return True

    def _refuse_concurrency(
        self, conn: socket.socket, addr: str, count: int, settings: ListenerSettings
    ) -> None:
        """Postfix's anvil refusal: smtpd_client_connection_count_limit reached."""
        get_logger("smtpd").warning(
            "Connection concurrency limit exceeded",
            count=count,
            client=f"unknown[{addr}]",
            service="smtp",
        )
        refuse(conn, f"421 4.7.0 {settings.myhostname} Error: too many connections from {addr}")
        self.ctx.observer.rejected("limits")

    async def _ask_anvil(
        self,
        conn: socket.socket,
        addr: str,
        settings: ListenerSettings,
        gate: IntakeGate,
        anvil: SharedCounts,
    ) -> None:
        """Serve one connection ``gate`` admitted once ``anvil`` allows it: the client's count
        is asked there first (every listener process's sessions: ``limits.SharedCounts``; no
        answer in time: this process's count). ``gate.started()`` once, when the session
        begins or the connection ends before it."""
        served = False
        try:
            count = await anvil.connect(addr)
            if count is None:
                count = self.ctx.counters.sessions(addr)
            if count > settings.client_connection_limit:
                self._refuse_concurrency(conn, addr, count, settings)
                return
            served = True
            await self._session(conn, addr, settings, gate)
        finally:
            if not served:  # refused, or cancelled while asking: _session's cleanup
                gate.started()
                conn.close()
                self.ctx.counters.disconnect(addr)
            anvil.disconnect(addr)
            if (task := asyncio.current_task(self._loop)) is not None:
                self._tasks.discard(task)

    async def _session(
        self, conn: socket.socket, addr: str, settings: ListenerSettings, gate: IntakeGate
    ) -> None:
        """Serve one connection ``gate`` admitted (``gate.started()`` once, when the session
        begins or the connection ends before it); the task leaves ``_tasks`` as it ends."""
        try:
            wrapper = settings.tls.context if settings.tls.wrappermode else None
            chan = Channel(
                _READ_LIMIT, tls=wrapper is not None, loop=self._loop, deadlines=self._deadlines
            )
            try:
                if wrapper is None:  # no handshake: the transport is up at the loop's next pass
                    await self._loop.connect_accepted_socket(lambda: chan, sock=conn)
                else:
                    async with asyncio.timeout(settings.smtpd_timeout):
                        await self._loop.connect_accepted_socket(
                            lambda: chan,
                            sock=conn,
                            ssl=wrapper,
                            ssl_handshake_timeout=settings.smtpd_timeout,
                        )
            except (OSError, ssl.SSLError, TimeoutError) as exc:
                if wrapper is not None:
                    get_logger("smtpd").info(
                        "SSL_accept error",
                        client=f"unknown[{addr}]",
                        reason=getattr(exc, "reason", None) or str(exc) or type(exc).__name__,
                    )
                conn.close()
                self.ctx.counters.disconnect(addr)
                return
            finally:
                gate.started()  # began (or never will): no longer pending
            session = Session(chan, settings, self.ctx, addr)
            self.sessions.add(session)
            self.ctx.observer.session_started()
            try:
                await session.run()
            except Exception as exc:  # a bug: it ends this session only, and is reported loudly
                get_logger("smtpd").error(
                    "internal error in SMTP session", client=session.client, error=repr(exc)
                )
                self._loop.call_exception_handler(
                    {"message": "SMTP session failed", "exception": exc}
                )
            finally:
                self.ctx.observer.session_ended()
                self.sessions.discard(session)
                self.ctx.counters.disconnect(addr)
                self.acceptor.room()  # a client waiting out a hold takes the place
        finally:
            if (task := asyncio.current_task(self._loop)) is not None:
                self._tasks.discard(task)  # nothing more to wait for (wait_closed)

    # -- stopping -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop accepting connections (sessions in progress carry on until wait_closed)."""
        self.acceptor.close()

    async def wait_closed(self) -> None:
        """Disconnect the remaining clients and wait for queued commits to finish.

        A message whose commit is already under way still lands in incoming/
        (complete); its client may not see the 250 and may send it again, as
        with Postfix. Nothing partial is ever left behind: each session
        removes its temporary file before it ends.
        """
        self.close()
        for session in list(self.sessions):
            session.close()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=_CLOSE_WAIT)
        if self.owns_shared:
            await self.committer.close()
            self.ctx.passwords.close()


def fd_session_cap(nofile: int) -> int:
    """Sessions that fit in ``nofile`` descriptors (two each, ``_FD_RESERVE`` kept), at least 1."""
    if nofile == resource.RLIM_INFINITY:
        return 1 << 30
    return max(1, (nofile - _FD_RESERVE) // 2)


async def start_listener(
    settings: ListenerSettings,
    spool: Spool,
    *,
    on_commit: Callable[[Committed], None],
    clock: Callable[[], float] = time.time,
    committer: GroupCommitter | None = None,
    passwords: PasswordChecker | None = None,
    observer: IntakeObserver = NULL_INTAKE,
    gate: FlowGate = NULL_GATE,
    sockets: Sequence[socket.socket] | None = None,
    accept_batch: int = ACCEPT_BATCH,
    recycler: Recycler | None = None,
) -> ListenerHandle:
    """Serve SMTP on the running loop: on ``sockets`` if given, else on ``settings.listen``.

    ``on_commit`` runs after each durable commit (the engine's wake-up).
    ``gate``: fair admission's intake check (``qmgrd.listener.flowgate``).
    ``sockets`` are listening sockets bound elsewhere (``bind_listener`` in
    the daemon's main process, inherited by a listener worker process); the
    handle closes them with the listener. ``accept_batch`` bounds the
    connections taken per wake-up (worker processes sharing a socket take
    few, so that an idle one gets its share). A bind failure is ConfigError
    (``bind_listener``). A ``committer`` or ``passwords`` passed in is
    shared with other listeners: the caller closes it, not ``wait_closed``.
    ``recycler``: the process's pool of queue files (``qmgrd.spool.recycle``; a
    listener worker claims its own part of it); a new one over the whole pool
    if not given.
    """
    loop = asyncio.get_running_loop()
    ctx = ListenerContext(
        committer=committer
        or GroupCommitter(spool, syncfs_dirty_limit=settings.syncfs_dirty_limit),
        on_commit=on_commit,
        clock=clock,
        counters=ClientCounters(),
        passwords=passwords or PasswordChecker(),
        observer=observer,
        gate=gate,
        recycler=recycler or Recycler(str(spool.root)),
    )
    handle = ListenerHandle(loop, ctx, settings)
    handle.owns_shared = committer is None and passwords is None
    handle.acceptor.batch = max(1, accept_batch)
    if sockets is None:
        try:
            sockets = bind_listener(settings)
        except ConfigError:
            if passwords is None:
                ctx.passwords.close()
            raise
    for sock in sockets:
        sock.setblocking(False)
        handle.acceptor.listen(sock)
    get_logger("smtpd").info(
        "listening",
        service=settings.service,
        addresses=" ".join(f"{h}:{p}" for h, p in handle.addresses),
        tls=settings.tls.level if not settings.tls.wrappermode else "wrappermode",
    )
    return handle
