"""The SMTP delivery agent (Postfix smtp(8) on aiosmtplib; DESIGN §6, notes §10).

One ``SmtpAgent`` per master.cf transport, shared by that transport's
concurrent deliveries. ``deliver(request)`` never raises: every remote or local
problem becomes a ``DeliveryResult``.

Theory of operation (one request):

1. Parse the nexthop: a list of destinations, tried in order; the last is the
   *final nexthop*. ``[host]`` means no MX lookup.
2. For each destination, look up its addresses (``mx.MxResolver``); addresses
   at the best preference that have a cached session are moved to the front.
3. Try addresses in order. Each counts toward ``smtp_mx_address_limit``;
   each session that got through the handshake (or came from the cache)
   counts toward ``smtp_mx_session_limit``. When either limit is reached this
   is the last address.
4. A session: TCP connect (``smtp_connect_timeout``), greeting and EHLO
   (``smtp_helo_timeout``; HELO if EHLO is refused), STARTTLS per
   ``smtp_tls_security_level``, then MAIL, one RCPT per recipient, DATA with
   the content streamed from the ``ContentSource``.
5. Error policy (Postfix smtp_trouble.c): a *soft* error (4xx, or 5xx with
   ``soft_bounce``, or any site-level failure such as a refused connection)
   leaves the recipient pending for the next address; a *hard* error (5xx)
   bounces it at once. Recipients still pending when the addresses run out are
   deferred (or bounced) with their last error.
6. Hop status (negative feedback, notes §10.4): set when a recipient ends
   deferred by a *site-level* failure (connect, greeting, EHLO, required TLS,
   421 anywhere, lost connection or timeout before the end of DATA, temporary
   DNS failure) and no session of this request completed a transaction.
   4xx/5xx replies to MAIL, RCPT or DATA are recipient or message results.

Connection cache (notes §10.2): with the request's LOAD flag (or for
``smtp_connection_cache_destinations``) an idle session for the same nexthop
label and endpoint is taken from the cache and probed with RSET; with STORE a
good session is returned to the cache instead of QUIT, unless it is older than
``smtp_connection_reuse_time_limit`` or was reused
``smtp_connection_reuse_count_limit`` times, or uses TLS while
``smtp_tls_connection_reuse`` is off.

Content streaming: aiosmtplib's ``data()`` wants the whole message, so DATA is
driven at the protocol level: ``DATA`` via ``execute_command``, then chunks
encoded by ``content.DataEncoder`` written to the protocol with flow control
(the protocol's drain helper, the mechanism ``StreamWriter.drain`` uses), then
the final reply read with ``read_response``.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiosmtplib
from aiosmtplib import SMTPResponse

from qmgrd.delivery.agent import (
    DeliveryRequest,
    DeliveryResult,
    HopStatus,
    Outcome,
    Recipient,
    RecipientResult,
)
from qmgrd.delivery.cache import CallLater, ConnectionCache
from qmgrd.delivery.content import DataEncoder
from qmgrd.delivery.mx import Destination, DnsFailure, Endpoint, MxResolver, parse_nexthop
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.errors import ConfigError
from qmgrd.log import get_logger

_ENHANCED = re.compile(r"^([245])\.(\d{1,3})\.(\d{1,3})(?=\s|$)")
_SAFE_XTEXT = re.compile(r"[!-*,-<>-~]")  # RFC 3461 xtext: printable except + and =


def reply_dsn(code: int, message: str) -> str:
    """The enhanced status code of a reply: from its text when it agrees, else from the code."""
    match = _ENHANCED.match(message)
    klass = str(code)[0] if 200 <= code < 600 else "4"
    if match is not None and match.group(1) == klass:
        return f"{match.group(1)}.{match.group(2)}.{match.group(3)}"
    return f"{klass}.0.0"


def reply_text(response: SMTPResponse) -> str:
    """One-line rendering of a (possibly multi-line) reply: ``"550 5.1.1 user unknown"``."""
    return f"{response.code} {' '.join(response.message.splitlines())}".strip()


def xtext(value: str) -> str:
    """Encode a DSN parameter value as RFC 3461 xtext."""
    return "".join(ch if _SAFE_XTEXT.fullmatch(ch) else f"+{ord(ch):02X}" for ch in value)


_XTEXT = re.compile(r"(?:[!-*,-<>-~]|\+[0-9A-F]{2})*")


def dsn_param(value: str) -> str:
    """A DSN parameter value for the wire: kept as is when it already is xtext.

    The listener stores ENVID and ORCPT exactly as the client sent them (validated
    xtext), so encoding them again would turn "+2B" into "+2B2B".
    """
    return value if _XTEXT.fullmatch(value) else xtext(value)


@dataclass(frozen=True, slots=True)
class _Failure:
    """Why a recipient is not delivered (yet)."""

    dsn: str
    reply: str
    relay: str = "none"
    site: bool = False  # site-level (THROTTLE class): may produce a hop status


@dataclass(slots=True, eq=False)
class Session:
    """An established SMTP session after the handshake (and STARTTLS, if any)."""

    smtp: aiosmtplib.SMTP
    endpoint: Endpoint
    label: str
    tls: bool
    created: float
    reuse_count: int = 0

    @property
    def key(self) -> tuple[str, str, str, int, bool]:
        """The connection-cache key: nexthop label and endpoint (host, addr, port, tls)."""
        ep = self.endpoint
        return (self.label, ep.host, ep.addr, ep.port, self.tls)

    def supports(self, extension: str) -> bool:
        """Whether the server's EHLO reply advertised ``extension``."""
        return self.smtp.supports_extension(extension)


@dataclass(slots=True, eq=False)
class SmtpStats:
    """Counters for tests and benchmarks."""

    connections: int = 0  # TCP connections opened
    reused: int = 0  # sessions taken from the cache and probed successfully
    deliveries: int = 0


@dataclass(slots=True, eq=False)
class _Attempt:
    """The mutable state of one ``deliver`` call."""

    request: DeliveryRequest
    pending: dict[int, Recipient]
    results: dict[int, RecipientResult] = field(default_factory=dict)
    last: dict[int, _Failure] = field(default_factory=dict)
    completed: bool = False  # some session completed a transaction
    setup_time: float = 0.0
    xfer_time: float = 0.0


class _Lost(Exception):
    """The session broke (disconnect, timeout, protocol error): a site-level failure."""

    def __init__(self, failure: _Failure) -> None:
        super().__init__(failure.reply)
        self.failure = failure


class _ContentError(Exception):
    """The content could not be read from the queue: a local problem, not the server's."""


class SmtpAgent:
    """Deliver entries over SMTP, with MX fallback, STARTTLS and a connection cache."""

    def __init__(
        self,
        settings: SmtpSettings,
        *,
        resolver: MxResolver | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        call_later: CallLater | None = None,
    ) -> None:
        """Create the agent; ``clock`` and ``call_later`` are injectable for tests."""
        self.settings = settings
        self.resolver = resolver or MxResolver(
            settings.dns_nameservers,
            timeout=settings.dns_timeout,
            rng=rng,
            randomize=settings.randomize_addresses,
            address_limit=settings.mx_address_limit,
        )
        self.clock = clock
        self.stats = SmtpStats()
        self.cache: ConnectionCache[Session] = ConnectionCache(
            ttl=settings.connection_cache_time_limit,
            closer=self._quit,
            call_later=call_later,
        )
        self._log = get_logger("smtp")
        self._tls_contexts: dict[str, ssl.SSLContext] = {}

    # ----------------------------------------------------------------- public

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Attempt delivery of one entry; never raises for remote or local problems."""
        self.stats.deliveries += 1
        attempt = _Attempt(request, dict(enumerate(request.recipients)))
        try:
            await self._deliver(attempt)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._log.exception(
                "smtp agent internal error", queue_id=request.queue_id, error=repr(exc)
            )
            failure = _Failure("4.3.0", f"internal error in smtp agent: {exc!r}", site=True)
            for idx in list(attempt.pending):
                attempt.last[idx] = failure
        return self._finish(attempt)

    async def close(self) -> None:
        """QUIT and close every cached session."""
        await self.cache.close()

    # --------------------------------------------------------------- top level

    async def _deliver(self, att: _Attempt) -> None:
        try:
            dests = parse_nexthop(att.request.nexthop)
        except ConfigError as exc:
            self._fail_pending(att, _Failure("4.3.5", f"bad nexthop: {exc}"))
            return
        for dest in dests:
            if not att.pending:
                return
            await self._try_destination(att, dest)

    def _caching(self, request: DeliveryRequest, dest: Destination) -> tuple[bool, bool]:
        """(load, store) for this destination (notes §10.2)."""
        s = self.settings
        always = dest.label in s.connection_cache_destinations or (
            dest.host in s.connection_cache_destinations
        )
        if always:
            return True, True
        if s.connection_cache_on_demand:
            return request.cache_load, request.cache_store
        return False, False

    async def _try_destination(self, att: _Attempt, dest: Destination) -> None:
        s = self.settings
        load, store = self._caching(att.request, dest)
        t0 = self.clock()
        found = await self.resolver.lookup(dest)
        att.setup_time += self.clock() - t0
        if isinstance(found, DnsFailure):
            self._fail_pending(att, _Failure(found.dsn, found.reason, site=found.transient))
            return
        endpoints = found
        if load and endpoints:
            best = endpoints[0].pref
            cached = [
                ep for ep in endpoints if ep.pref == best and self._has_cached(dest.label, ep)
            ]
            if cached:
                endpoints = cached + [ep for ep in endpoints if ep not in cached]
        sessions = 0
        for count, ep in enumerate(endpoints, start=1):
            if not att.pending:
                return
            last_addr = count == len(endpoints) or (
                s.mx_address_limit > 0 and count >= s.mx_address_limit
            )
            t0 = self.clock()
            session = await self._take_cached(dest.label, ep) if load else None
            if session is None:
                opened = await self._open(ep, dest.label)
                if isinstance(opened, _Failure):
                    att.setup_time += self.clock() - t0
                    self._fail_pending(att, opened)
                    if last_addr:
                        return
                    continue
                session = opened
            att.setup_time += self.clock() - t0
            sessions += 1
            t1 = self.clock()
            try:
                reusable = await self._transaction(att, session)
            except BaseException:  # cancelled (shutdown) or a bug: never leak the socket
                session.smtp.close()
                raise
            att.xfer_time += self.clock() - t1
            if reusable and store and self._may_reuse(session):
                session.reuse_count += 1
                self.cache.store(session.key, session)
            elif reusable:
                await self._quit(session)
            else:
                session.smtp.close()
            if last_addr or (s.mx_session_limit > 0 and sessions >= s.mx_session_limit):
                return

    # ---------------------------------------------------------------- results

    def _fail_pending(self, att: _Attempt, failure: _Failure) -> None:
        """Apply one failure to every pending recipient (site-level or message-level)."""
        for idx in list(att.pending):
            self._fail(att, idx, failure)

    def _fail(self, att: _Attempt, idx: int, failure: _Failure) -> None:
        """Bounce now on a hard error; on a soft one keep the recipient for the next server."""
        if failure.dsn.startswith("5") and not self.settings.soft_bounce:
            rcpt = att.pending.pop(idx)
            att.results[idx] = RecipientResult(
                rcpt, Outcome.BOUNCED, failure.dsn, failure.reply, failure.relay
            )
            att.last.pop(idx, None)
        else:
            att.last[idx] = failure

    def _sent(self, att: _Attempt, idx: int, response: SMTPResponse, relay: str) -> None:
        rcpt = att.pending.pop(idx)
        att.results[idx] = RecipientResult(
            rcpt,
            Outcome.SENT,
            reply_dsn(response.code, response.message),
            reply_text(response),
            relay,
        )
        att.last.pop(idx, None)

    def _finish(self, att: _Attempt) -> DeliveryResult:
        """Defer what is left and build the result, with a hop status if one is due."""
        hop: HopStatus | None = None
        for idx, rcpt in list(att.pending.items()):
            failure = att.last.get(idx) or _Failure(
                "4.3.0", "server unavailable or unable to receive mail", site=True
            )
            dsn = "4" + failure.dsn[1:] if failure.dsn.startswith("5") else failure.dsn
            att.results[idx] = RecipientResult(
                rcpt, Outcome.DEFERRED, dsn, failure.reply, failure.relay
            )
            if failure.site and not att.completed and hop is None:
                hop = HopStatus(dsn, failure.reply)
        att.pending.clear()
        ordered = tuple(att.results[idx] for idx in range(len(att.request.recipients)))
        extra: dict[str, str] = {}
        return DeliveryResult(
            recipients=ordered,
            hop=hop,
            conn_setup_time=att.setup_time,
            transmission_time=att.xfer_time,
            extra=extra,
        )

    # ----------------------------------------------------------------- caching

    def _has_cached(self, label: str, ep: Endpoint) -> bool:
        tls_options = (False, True) if self.settings.tls_security_level != "none" else (False,)
        return any((label, ep.host, ep.addr, ep.port, tls) in self.cache for tls in tls_options)

    async def _take_cached(self, label: str, ep: Endpoint) -> Session | None:
        """A cached session for this endpoint that answers RSET, or None."""
        for tls in (True, False):
            while True:
                session = self.cache.take((label, ep.host, ep.addr, ep.port, tls))
                if session is None:
                    break
                try:
                    response = await session.smtp.execute_command(
                        b"RSET", timeout=self.settings.rset_timeout
                    )
                except (aiosmtplib.SMTPException, OSError):
                    session.smtp.close()
                    continue
                if response.code == 250:
                    self.stats.reused += 1
                    return session
                session.smtp.close()
        return None

    def _may_reuse(self, session: Session) -> bool:
        s = self.settings
        if session.tls and not s.tls_connection_reuse:
            return False
        if self.clock() - session.created >= s.connection_reuse_time_limit:
            return False
        limit = s.connection_reuse_count_limit
        return not (limit > 0 and session.reuse_count >= limit)

    async def _quit(self, session: Session) -> None:
        """End a session politely (QUIT), closing it whatever happens."""
        try:
            if session.smtp.is_connected:
                await session.smtp.execute_command(b"QUIT", timeout=self.settings.quit_timeout)
        except (aiosmtplib.SMTPException, OSError):
            pass
        finally:
            session.smtp.close()

    # ------------------------------------------------------------- handshake

    async def _open(
        self, ep: Endpoint, label: str, tls_level: str | None = None
    ) -> Session | _Failure:
        """Connect, read the greeting, EHLO and STARTTLS; a failure is site-level."""
        s = self.settings
        level = tls_level or s.tls_security_level
        relay = ep.relay
        created = self.clock()
        family = socket.AF_INET6 if ":" in ep.addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        # Without TCP_NODELAY the end-of-data line waits for the delayed ACK of the content
        # (Nagle): 40 ms per message. asyncio sets it only on sockets it creates itself.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.sock_connect(sock, (ep.addr, ep.port)), s.connect_timeout)
        except TimeoutError:
            sock.close()
            return _Failure("4.4.1", f"connect to {relay}: Connection timed out", relay, True)
        except OSError as exc:
            sock.close()
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            return _Failure("4.4.1", f"connect to {relay}: {reason}", relay, True)
        self.stats.connections += 1
        smtp = aiosmtplib.SMTP(
            sock=sock, local_hostname=s.helo_name, start_tls=False, timeout=s.helo_timeout
        )
        try:
            await smtp.connect(timeout=s.helo_timeout)
        except aiosmtplib.SMTPConnectResponseError as exc:
            smtp.close()
            dsn = reply_dsn(exc.code, exc.message)
            if dsn.startswith("5") and s.skip_5xx_greeting:
                dsn = "4" + dsn[1:]
            text = f"host {relay} refused to talk to me: {exc.code} {exc.message}"
            return _Failure(dsn, text, relay, True)
        except aiosmtplib.SMTPTimeoutError:
            smtp.close()
            return _Failure(
                "4.4.2",
                f"conversation with {relay} timed out while receiving the initial server greeting",
                relay,
                True,
            )
        except (aiosmtplib.SMTPException, OSError):
            smtp.close()
            return _Failure(
                "4.4.2",
                f"lost connection with {relay} while receiving the initial server greeting",
                relay,
                True,
            )
        session = Session(smtp, ep, label, tls=False, created=created)
        try:
            await self._hello(session)
            if level != "none":
                failure = await self._starttls(session, level)
                if isinstance(failure, str):  # "fallback"
                    session.smtp.close()
                    return await self._open(ep, label, tls_level="none")
                if failure is not None:
                    session.smtp.close()
                    return failure
        except _Lost as lost:
            session.smtp.close()
            return lost.failure
        self._log.debug("connected", relay=relay, tls=session.tls)
        return session

    async def _command(
        self, session: Session, stage: str, timeout: float, *args: bytes
    ) -> SMTPResponse:
        """Run one command; a lost connection or timeout becomes ``_Lost`` (4.4.2, site)."""
        relay = session.endpoint.relay
        try:
            return await session.smtp.execute_command(*args, timeout=timeout)
        except aiosmtplib.SMTPTimeoutError:
            raise _Lost(
                _Failure("4.4.2", f"conversation with {relay} timed out while {stage}", relay, True)
            ) from None
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise _Lost(
                _Failure("4.4.2", f"lost connection with {relay} while {stage}: {exc}", relay, True)
            ) from None

    async def _hello(self, session: Session) -> None:
        """EHLO, or HELO if EHLO is refused; a refusal is a site-level failure."""
        s = self.settings
        relay = session.endpoint.relay
        helo = s.helo_name.encode("ascii", "replace")
        response = await self._command(session, "sending EHLO", s.helo_timeout, b"EHLO", helo)
        if response.code == 250:
            session.smtp.last_ehlo_response = response
            return
        if response.code != 421:
            response = await self._command(session, "sending HELO", s.helo_timeout, b"HELO", helo)
            if response.code == 250:
                session.smtp.last_helo_response = response
                return
        raise _Lost(
            _Failure(
                reply_dsn(response.code, response.message),
                f"host {relay} refused to talk to me: {reply_text(response)}",
                relay,
                True,
            )
        )

    def _tls_context(self, level: str) -> ssl.SSLContext:
        ctx = self._tls_contexts.get(level)
        if ctx is not None:
            return ctx
        if level == "verify":
            ctx = ssl.create_default_context(cafile=self.settings.tls_cafile or None)
        else:
            # may / encrypt: encryption without authentication, as in Postfix.
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        self._tls_contexts[level] = ctx
        return ctx

    async def _starttls(self, session: Session, level: str) -> _Failure | str | None:
        """STARTTLS per level: None = go on, "fallback" = retry in plaintext, or a failure."""
        s = self.settings
        relay = session.endpoint.relay
        mandatory = level != "may"
        if not session.supports("starttls"):
            if mandatory:
                return _Failure(
                    "4.7.4", f"TLS is required, but was not offered by host {relay}", relay, True
                )
            return None
        try:
            await session.smtp.starttls(
                tls_context=self._tls_context(level),
                server_hostname=session.endpoint.host,
                timeout=s.starttls_timeout,
            )
        except aiosmtplib.SMTPResponseException as exc:
            if not mandatory and session.smtp.is_connected:
                return None  # STARTTLS refused: carry on in plaintext
            return _Failure(
                "4.7.5",
                f"STARTTLS refused by host {relay}: {exc.code} {exc.message}",
                relay,
                True,
            )
        except (aiosmtplib.SMTPException, ssl.SSLError, OSError) as exc:
            if not mandatory:
                self._log.debug("tls handshake failed, falling back", relay=relay, error=str(exc))
                return "fallback"
            return _Failure(
                "4.7.5", f"Cannot start TLS with {relay}: handshake failure: {exc}", relay, True
            )
        session.tls = True
        await self._hello(session)
        return None

    # ------------------------------------------------------------ transaction

    async def _transaction(self, att: _Attempt, session: Session) -> bool:
        """MAIL, RCPT, DATA for the pending recipients; True if the session is reusable."""
        try:
            return await self._transaction_steps(att, session)
        except _Lost as lost:
            session.smtp.close()
            self._fail_pending(att, lost.failure)
            return False
        except _ContentError as exc:
            session.smtp.close()
            self._fail_pending(att, _Failure("4.3.0", f"error reading message content: {exc}"))
            return False

    async def _transaction_steps(self, att: _Attempt, session: Session) -> bool:
        s = self.settings
        req = att.request
        relay = session.endpoint.relay
        host = f"host {relay}"

        def said(response: SMTPResponse, command: str) -> _Failure:
            if response.code == 421:
                return _Failure(
                    reply_dsn(response.code, response.message),
                    f"{host} said: {reply_text(response)} (in reply to {command} command)",
                    relay,
                    True,
                )
            return _Failure(
                reply_dsn(response.code, response.message),
                f"{host} said: {reply_text(response)} (in reply to {command} command)",
                relay,
            )

        if req.smtputf8 and not session.supports("smtputf8"):
            self._fail_pending(
                att,
                _Failure("5.6.7", f"SMTPUTF8 is required, but was not offered by {host}", relay),
            )
            return True
        size_limit = session.smtp.esmtp_extensions.get("size", "")
        if size_limit.isdigit() and 0 < int(size_limit) < req.content.size:
            self._fail_pending(
                att,
                _Failure(
                    "5.3.4",
                    f"message size {req.content.size} exceeds size limit {size_limit} "
                    f"of server {relay}",
                    relay,
                ),
            )
            return True

        dsn_ext = session.supports("dsn")
        options: list[bytes] = []
        if session.supports("size"):
            options.append(f"SIZE={req.content.size}".encode())
        if req.body_8bitmime and session.supports("8bitmime"):
            options.append(b"BODY=8BITMIME")
        if req.smtputf8:
            options.append(b"SMTPUTF8")
        if dsn_ext and req.ret:
            options.append(f"RET={req.ret}".encode())
        if dsn_ext and req.envid:
            options.append(f"ENVID={dsn_param(req.envid)}".encode())
        encoding = "utf-8" if req.smtputf8 else "ascii"

        response = await self._command(
            session,
            "sending MAIL FROM",
            s.mail_timeout,
            b"MAIL",
            f"FROM:<{req.sender}>".encode(encoding, "replace"),
            *options,
        )
        if response.code == 421:
            raise _Lost(said(response, "MAIL FROM"))
        if response.code // 100 != 2:
            self._fail_pending(att, said(response, "MAIL FROM"))
            att.completed = True
            return await self._reset(session)

        accepted: list[int] = []
        for idx, rcpt in list(att.pending.items()):
            rcpt_options: list[bytes] = []
            if dsn_ext and rcpt.notify:
                rcpt_options.append(("NOTIFY=" + ",".join(sorted(rcpt.notify))).encode())
            if dsn_ext and rcpt.orcpt:
                addr_type, _, addr = rcpt.orcpt.partition(";")
                rcpt_options.append(f"ORCPT={addr_type};{dsn_param(addr)}".encode())
            response = await self._command(
                session,
                "sending RCPT TO",
                s.rcpt_timeout,
                b"RCPT",
                f"TO:<{rcpt.address}>".encode(encoding, "replace"),
                *rcpt_options,
            )
            if response.code == 421:
                raise _Lost(said(response, "RCPT TO"))
            if response.code // 100 == 2:
                accepted.append(idx)
            else:
                self._fail(att, idx, said(response, "RCPT TO"))
        if not accepted:
            att.completed = True
            return await self._reset(session)

        response = await self._command(session, "sending DATA", s.data_init_timeout, b"DATA")
        if response.code == 421:
            raise _Lost(said(response, "DATA"))
        if response.code != 354:
            for idx in accepted:
                self._fail(att, idx, said(response, "DATA"))
            att.completed = True
            return await self._reset(session)

        response = await self._send_content(session, req)
        if response.code == 421:
            raise _Lost(said(response, "end of DATA"))
        att.completed = True
        if response.code // 100 == 2:
            for idx in accepted:
                self._sent(att, idx, response, relay)
            return True
        for idx in accepted:
            self._fail(att, idx, said(response, "end of DATA"))
        return True

    async def _reset(self, session: Session) -> bool:
        """RSET after a failed transaction so the session can be reused."""
        try:
            response = await self._command(
                session, "sending RSET", self.settings.rset_timeout, b"RSET"
            )
        except _Lost:
            return False
        return response.code == 250

    async def _send_content(self, session: Session, req: DeliveryRequest) -> SMTPResponse:
        """Stream the content after 354 and read the final reply."""
        s = self.settings
        relay = session.endpoint.relay
        protocol = session.smtp.protocol
        if protocol is None:
            raise _Lost(
                _Failure(
                    "4.4.2", f"lost connection with {relay} while sending message body", relay, True
                )
            )
        encoder = DataEncoder()
        stage = "sending message body"
        try:
            iterator = aiter(req.content.chunks())
            while True:
                try:
                    chunk = await anext(iterator)
                except StopAsyncIteration:
                    break
                except Exception as exc:
                    raise _ContentError(str(exc)) from exc
                data = encoder.feed(chunk)
                if data:
                    protocol.write(data)
                    # Flow control: wait while the transport buffer is over its high mark.
                    await asyncio.wait_for(protocol._drain_helper(), s.data_xfer_timeout)
            protocol.write(encoder.finish())
            stage = "sending end of data -- message may be sent more than once"
            return await protocol.read_response(timeout=s.data_done_timeout)
        except (TimeoutError, aiosmtplib.SMTPTimeoutError):
            raise _Lost(
                _Failure("4.4.2", f"conversation with {relay} timed out while {stage}", relay, True)
            ) from None
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise _Lost(
                _Failure("4.4.2", f"lost connection with {relay} while {stage}: {exc}", relay, True)
            ) from None
