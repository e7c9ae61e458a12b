"""Accepting SMTP connections on the daemon's loop: session caps, fd exhaustion, shutdown.

The listener accepts on its own non-blocking listening sockets (a reader
callback on the loop, up to ``ACCEPT_BATCH`` connections per wake-up) so
that admission is decided before a session exists:

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

A refusal for capacity costs as little as it can: one ``send`` of the
reply line before any session, TLS or banner, then ``close``. A listener that
refused for capacity also stops watching that socket for ``REFUSE_HOLD``
seconds (several listener processes share each listening socket: the
connections go meanwhile to one that has room), then answers every client
waiting in it, ``ACCEPT_DRAIN`` at most, in one go (admitted if there is room
again, refused otherwise): a refused client waits ``REFUSE_HOLD`` plus the
loop's lag at most, and a flood costs one wake-up per hold, not one per
connection in every process.

The cap is also kept within the process's open-file limit: a session may
hold two descriptors (its socket and its queue file), and ``_FD_RESERVE`` are
left for the rest of the daemon (spool work, delivery connections), so with
a soft ``RLIMIT_NOFILE`` of 1024 at most 384 sessions are admitted (logged at
start when that lowers ``smtpd_session_limit``; the systemd unit sets 65536).

When ``accept`` fails for lack of file descriptors or memory (EMFILE,
ENFILE, ENOBUFS, ENOMEM) the listener logs a warning, stops accepting for
``_ACCEPT_RETRY`` seconds (the pending clients wait in the kernel's backlog)
and then tries again: sessions in progress go on, and new clients are
served as soon as descriptors are free again.

Each admitted connection becomes a ``Session`` task (``qmgrd.listener.session``)
with the settings current at accept time; a reload (``update``) applies to
new sessions.
"""

from __future__ import annotations

import asyncio
import errno
import resource
import socket
import ssl
import time
from collections.abc import Callable, Sequence

from qmgrd.errors import ConfigError
from qmgrd.listener.auth import PasswordChecker
from qmgrd.listener.binding import bind_listener
from qmgrd.listener.channel import Channel
from qmgrd.listener.flowgate import NULL_GATE, FlowGate
from qmgrd.listener.inflow import OVERLOAD_REPLY, IntakeGate, RefusalNotes
from qmgrd.listener.limits import ClientCounters, SharedCounts
from qmgrd.listener.observer import NULL_INTAKE, Committed, IntakeObserver
from qmgrd.listener.session import ListenerContext, Session
from qmgrd.listener.settings import ListenerSettings
from qmgrd.log import get_logger
from qmgrd.spool import GroupCommitter, Spool

ACCEPT_BATCH = 64  # connections accepted per wake-up before other work runs
ACCEPT_DRAIN = 256  # connections answered at most when a hold ends
REFUSE_HOLD = 0.02  # seconds a listener that refused for capacity leaves its socket alone
_UNAVAILABLE = OVERLOAD_REPLY.encode("ascii") + b"\r\n"
_ACCEPT_RETRY = 0.5  # seconds without accepting after EMFILE and friends
_READ_LIMIT = 65536  # StreamReader buffer: the transport pauses above twice this
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_FD_RESERVE = 256  # descriptors kept for everything but sessions
_CLOSE_WAIT = 10.0  # seconds wait_closed gives sessions to clean up after a disconnect


class ListenerHandle:
    """The running listener: its sockets, live sessions, counters and group committer."""

    __slots__ = (
        "_accept_batch",
        "_fd_cap",
        "_limited",
        "_loop",
        "_sockets",
        "_tasks",
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
        self._sockets: list[socket.socket] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.ctx = ctx
        self.committer = ctx.committer
        self.sessions: set[Session] = set()
        self.settings = settings
        self.owns_shared = True  # wait_closed closes the committer and password pool
        self._accept_batch = ACCEPT_BATCH
        self._fd_cap = fd_session_cap(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self._limited = RefusalNotes()  # smtpd_session_limit refusals, logged a second at a time
        self._check_cap(settings)

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
        self.settings = settings

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The bound (host, port) pairs; tests bind port 0 and read the real port here."""
        out = []
        for sock in self._sockets:
            if sock.fileno() >= 0:
                name = sock.getsockname()
                out.append((str(name[0]), int(name[1])))
        return out

    # -- accepting ----------------------------------------------------------------------

    def _listen(self, sock: socket.socket) -> None:
        self._sockets.append(sock)
        self._loop.add_reader(sock.fileno(), self._on_readable, sock)

    def _on_readable(self, sock: socket.socket) -> None:
        self._accept(sock, self._accept_batch)

    def _accept(self, sock: socket.socket, count: int) -> None:
        """Accept up to ``count`` connections; after a refusal for capacity, hold (module doc)."""
        full = False
        for _ in range(count):
            try:
                conn, peer = sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    self._pause(sock, exc)
                    return
                continue  # ECONNABORTED and the like: that client is gone
            if not self._admit(conn, str(peer[0]) if peer else "unknown"):
                full = True
        if full:
            self._loop.remove_reader(sock.fileno())
            self._loop.call_later(REFUSE_HOLD, self._drain, sock)

    def _drain(self, sock: socket.socket) -> None:
        """After a hold: watch the socket again, and answer every client waiting in it."""
        if sock.fileno() >= 0:  # not closed meanwhile
            self._loop.add_reader(sock.fileno(), self._on_readable, sock)
            self._accept(sock, ACCEPT_DRAIN)

    def _pause(self, sock: socket.socket, exc: OSError) -> None:
        get_logger("smtpd").warning(
            "accept connection: out of resources; new clients wait",
            error=exc.strerror or str(exc),
            retry_in=f"{_ACCEPT_RETRY}s",
        )
        self._loop.remove_reader(sock.fileno())
        self._loop.call_later(_ACCEPT_RETRY, self._resume, sock)

    def _resume(self, sock: socket.socket) -> None:
        if sock.fileno() >= 0:  # not closed meanwhile
            self._loop.add_reader(sock.fileno(), self._on_readable, sock)

    def _admit(self, conn: socket.socket, addr: str) -> bool:
        """Start a session for ``conn``, or refuse it; False: refused for lack of capacity."""
        settings = self.settings
        ctx = self.ctx
        counters = ctx.counters
        ctx.observer.connected()
        if counters.total >= min(settings.session_limit, self._fd_cap):
            _refuse(conn, _UNAVAILABLE)
            ctx.observer.rejected("limits")
            self._limited.add()
            if count := self._limited.take():
                get_logger("smtpd").warning(
                    "session limit reached: connection refused",
                    client=f"unknown[{addr}]",
                    smtpd_session_limit=min(settings.session_limit, self._fd_cap),
                    count=count,
                )
            return False
        gate = ctx.inflow
        if not gate.admit_session():  # regulator: over capacity (listener.inflow)
            _refuse(conn, _UNAVAILABLE)
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
        task = self._loop.create_task(self._serve(conn, addr, settings, gate, anvil))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
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
        _refuse(conn, f"421 4.7.0 {settings.myhostname} Error: too many connections from {addr}")
        self.ctx.observer.rejected("limits")

    async def _serve(
        self,
        conn: socket.socket,
        addr: str,
        settings: ListenerSettings,
        gate: IntakeGate,
        anvil: SharedCounts | None = None,
    ) -> None:
        """Serve one connection ``gate`` admitted; with ``anvil`` the client's count is asked
        there first (every listener process's sessions: ``limits.SharedCounts``; no answer in
        time: this process's count). ``gate.started()`` once, when the session begins or
        the connection ends before it."""
        if anvil is None:
            await self._session(conn, addr, settings, gate)
            return
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

    async def _session(
        self, conn: socket.socket, addr: str, settings: ListenerSettings, gate: IntakeGate
    ) -> None:
        chan = Channel(_READ_LIMIT)
        wrapper = settings.tls.context if settings.tls.wrappermode else None
        try:
            async with asyncio.timeout(settings.smtpd_timeout):
                await self._loop.connect_accepted_socket(
                    lambda: chan,
                    sock=conn,
                    ssl=wrapper,
                    ssl_handshake_timeout=settings.smtpd_timeout if wrapper else None,
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
            self._loop.call_exception_handler({"message": "SMTP session failed", "exception": exc})
        finally:
            self.ctx.observer.session_ended()
            self.sessions.discard(session)
            self.ctx.counters.disconnect(addr)

    # -- stopping -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop accepting connections (sessions in progress carry on until wait_closed)."""
        for sock in self._sockets:
            if sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())
                sock.close()

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


def _refuse(conn: socket.socket, reply: str | bytes) -> None:
    """Send one reply line to a connection we will not serve, and close it.

    The cheapest answer there is: no TLS, no banner, no session, one
    non-blocking send of a line that fits any socket buffer, no log line
    (the callers count refusals and log them a second at a time).
    """
    try:
        conn.setblocking(False)
        conn.send(reply if isinstance(reply, bytes) else reply.encode("ascii", "replace") + b"\r\n")
    except OSError:
        pass  # the client is gone already
    conn.close()


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
    """
    loop = asyncio.get_running_loop()
    ctx = ListenerContext(
        committer=committer or GroupCommitter(spool),
        on_commit=on_commit,
        clock=clock,
        counters=ClientCounters(),
        passwords=passwords or PasswordChecker(),
        observer=observer,
        gate=gate,
    )
    handle = ListenerHandle(loop, ctx, settings)
    handle.owns_shared = committer is None and passwords is None
    handle._accept_batch = max(1, accept_batch)
    if sockets is None:
        try:
            sockets = bind_listener(settings)
        except ConfigError:
            if passwords is None:
                ctx.passwords.close()
            raise
    for sock in sockets:
        sock.setblocking(False)
        handle._listen(sock)
    get_logger("smtpd").info(
        "listening",
        service=settings.service,
        addresses=" ".join(f"{h}:{p}" for h, p in handle.addresses),
        tls=settings.tls.level if not settings.tls.wrappermode else "wrappermode",
    )
    return handle
