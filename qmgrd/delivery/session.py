"""Opening an SMTP client session: connect, greeting, EHLO, TLS, AUTH (notes §10).

``Connector.open(ep, dest, policy, creds)`` returns a ready ``Session`` or a
site-level ``Failure`` (a destination failure: it may become a hop status):

1. TCP connect (``smtp_connect_timeout``) from ``smtp_bind_address`` /
   ``smtp_bind_address6`` when set, with TCP_NODELAY;
2. with ``smtp_tls_wrappermode`` the TLS handshake right away (SMTPS, 465);
3. greeting and EHLO (``smtp_helo_timeout``; HELO if EHLO is refused);
4. otherwise STARTTLS per the destination's ``TlsPolicy``: ``may`` goes on in
   plaintext when it is not offered or refused, and reconnects in plaintext
   after a failed handshake (the ``Fallback`` value); the mandatory levels defer
   with 4.7.4 / 4.7.5;
5. after TLS, the certificate check of ``verify``/``secure`` and the
   ``smtp_tls_loglevel`` line ("Verified TLS connection established to ...");
6. AUTH when credentials were found and the server offers AUTH (``SaslClient``).

``Session.key`` is the connection-cache key: the nexthop label, the endpoint,
whether TLS is on and the SASL user, so an authenticated session is only
reused for mail that would authenticate as the same user.

The conversation runs on ``connection.Connection`` (our own client protocol,
``client``); ``Session`` and ``run_command`` live in ``conversation`` and are
re-exported here.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import ssl
from collections.abc import Callable
from typing import Any

from qmgrd.delivery.agent import Throttle
from qmgrd.delivery.client import ReplyError, ehlo_extensions
from qmgrd.delivery.connection import Connection
from qmgrd.delivery.conversation import (
    CacheKey,
    Session,
    SmtpStats,
    broken,
    end_session,
    run_command,
)
from qmgrd.delivery.mx import Destination, Endpoint
from qmgrd.delivery.replies import Failure, Lost, reply_dsn, reply_text, throttle_kind
from qmgrd.delivery.sasl import Credentials, SaslClient
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.tlspolicy import TlsClient, TlsPolicy, describe

__all__ = [
    "FALLBACK",
    "CacheKey",
    "Connector",
    "Session",
    "SmtpStats",
    "broken",
    "end_session",
    "run_command",
]


class Fallback:
    """``may``: the TLS handshake failed, reconnect in plaintext."""


FALLBACK = Fallback()


class Connector:
    """Opens sessions for one SMTP agent (shared settings, TLS and SASL clients)."""

    def __init__(
        self,
        settings: SmtpSettings,
        tls: TlsClient,
        sasl: SaslClient,
        stats: SmtpStats,
        clock: Callable[[], float],
        log: Any,
    ) -> None:
        """Keep the collaborators; nothing is opened here."""
        self.settings = settings
        self.tls = tls
        self.sasl = sasl
        self.stats = stats
        self.clock = clock
        self.log = log

    async def open(
        self,
        ep: Endpoint,
        dest: Destination,
        policy: TlsPolicy,
        creds: Credentials | None,
    ) -> Session | Failure:
        """A ready session to ``ep``, or a site-level failure (module doc)."""
        opened = await self._open(ep, dest, policy, creds)
        if isinstance(opened, Fallback):
            opened = await self._open(ep, dest, TlsPolicy("none"), creds)
        assert not isinstance(opened, Fallback)
        return opened

    async def _connect(self, ep: Endpoint) -> socket.socket | Failure:
        s = self.settings
        relay = ep.relay
        family = socket.AF_INET6 if ":" in ep.addr else socket.AF_INET
        bind = s.bind_address6 if family == socket.AF_INET6 else s.bind_address
        try:
            sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        except OSError as exc:  # no IPv6 on this host, or out of descriptors
            return Failure("4.4.1", f"connect to {relay}: {exc.strerror or exc}", relay, True)
        try:
            # Without TCP_NODELAY the end-of-data line waits for the delayed ACK of the content
            # (Nagle): 40 ms per message. asyncio sets it only on sockets it creates itself.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            if bind:
                sock.bind((bind, 0))
            async with asyncio.timeout(s.connect_timeout):  # no task per connect (wait_for)
                await asyncio.get_running_loop().sock_connect(sock, (ep.addr, ep.port))
        except TimeoutError:
            sock.close()
            return Failure("4.4.1", f"connect to {relay}: Connection timed out", relay, True)
        except OSError as exc:
            sock.close()
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            where = f" from {bind}" if bind and exc.errno == errno.EADDRNOTAVAIL else ""
            # A refused connection is what a full server (or its firewall) answers, too.
            full: Throttle | None = "full" if exc.errno == errno.ECONNREFUSED else None
            return Failure("4.4.1", f"connect to {relay}{where}: {reason}", relay, True, full)
        except BaseException:
            sock.close()
            raise
        self.stats.connections += 1
        return sock

    async def _open(
        self,
        ep: Endpoint,
        dest: Destination,
        policy: TlsPolicy,
        creds: Credentials | None,
    ) -> Session | Failure | Fallback:
        s = self.settings
        relay = ep.relay
        created = self.clock()
        sock = await self._connect(ep)
        if isinstance(sock, Failure):
            return sock
        wrapper = s.tls_wrappermode and policy.level != "none"
        conn = Connection()
        stage = "receiving the initial server greeting"
        try:
            if wrapper:
                await asyncio.get_running_loop().create_connection(
                    lambda: conn,
                    sock=sock,
                    ssl=self.tls.context(policy),
                    server_hostname=ep.host,
                    ssl_handshake_timeout=s.helo_timeout,
                )
            else:
                await asyncio.get_running_loop().create_connection(lambda: conn, sock=sock)
            greeting = await conn.read_reply(s.helo_timeout)
        except ssl.SSLError as exc:
            self._drop(sock, conn)
            return self._handshake_failure(exc, relay)
        except BaseException as exc:  # cancelled (shutdown) too: never leak the socket
            self._drop(sock, conn)
            if not isinstance(exc, (TimeoutError, ReplyError, OSError)):
                raise
            if isinstance(exc, TimeoutError):
                return Failure(
                    "4.4.2", f"conversation with {relay} timed out while {stage}", relay, True
                )
            return Failure("4.4.2", f"lost connection with {relay} while {stage}", relay, True)
        if greeting.code // 100 != 2:
            conn.close()
            dsn = reply_dsn(greeting.code, greeting.message)
            if dsn.startswith("5") and s.skip_5xx_greeting:
                dsn = "4" + dsn[1:]
            text = f"host {relay} refused to talk to me: {reply_text(greeting)}"
            return Failure(dsn, text, relay, True, throttle_kind(greeting.code, greeting.message))
        session = Session(conn, ep, dest.label, tls=wrapper, created=created)
        looped = self._loops_back(greeting.message, session)
        if looped is not None:
            await self._quit_quietly(session)
            return looped
        try:
            if wrapper:
                self.stats.tls_handshakes += 1
                failure = self._check_tls(session, dest, policy)
                if failure is not None:
                    session.close()
                    return failure
            await self.hello(session)
            if not wrapper and policy.level != "none":
                result = await self._starttls(session, dest, policy)
                if result is not None:
                    session.close()
                    return result
            if creds is not None and session.supports("auth"):
                failure = await self.sasl.authenticate(
                    lambda stage, *args: run_command(session, stage, s.helo_timeout, *args),
                    creds,
                    session.extensions["auth"].upper().split(),
                    session.tls,
                    relay,
                )
                if failure is not None:
                    await self._quit_quietly(session)
                    return failure
                session.user = creds.username
        except Lost as lost:
            session.close()
            return lost.failure
        except BaseException:  # cancelled (shutdown) or a bug: never leak the socket
            session.close()
            raise
        self.log.debug("connected", relay=relay, tls=session.tls, auth=bool(session.user))
        return session

    @staticmethod
    def _drop(sock: socket.socket, conn: Connection) -> None:
        """Close a connection that failed before its greeting (the socket if no transport)."""
        if conn.transport is None:
            sock.close()
        else:
            conn.close()

    async def hello(self, session: Session) -> None:
        """EHLO, or HELO if EHLO is refused; a refusal is a site-level failure (``Lost``)."""
        s = self.settings
        relay = session.endpoint.relay
        helo = s.helo_name.encode("ascii")
        response = await run_command(session, "sending EHLO", s.helo_timeout, b"EHLO", helo)
        if response.code == 250:
            session.extensions = ehlo_extensions(response)
            self._raise_if_loop(response.message, session)
            return
        if response.code != 421:
            response = await run_command(session, "sending HELO", s.helo_timeout, b"HELO", helo)
            if response.code == 250:
                session.extensions = {}
                self._raise_if_loop(response.message, session)
                return
        raise Lost(
            Failure(
                reply_dsn(response.code, response.message),
                f"host {relay} refused to talk to me: {reply_text(response)}",
                relay,
                True,
                throttle_kind(response.code, response.message) if response.code == 421 else None,
            )
        )

    def _loops_back(self, text: str, session: Session) -> Failure | None:
        """Postfix's loop test: the server greets or answers EHLO with our ``myhostname``."""
        me = self.settings.myhostname
        words = text.split(None, 1)
        if not me or not words or words[0].rstrip(".").lower() != me.rstrip(".").lower():
            return None
        relay = session.endpoint.relay
        self.log.warning(f"host {relay} greeted me with my own hostname {me}")
        return Failure("5.4.6", f"mail for {session.label} loops back to myself", relay, True)

    def _raise_if_loop(self, text: str, session: Session) -> None:
        failure = self._loops_back(text, session)
        if failure is not None:
            raise Lost(failure)

    async def _starttls(
        self, session: Session, dest: Destination, policy: TlsPolicy
    ) -> Failure | Fallback | None:
        """STARTTLS per policy: None = go on, FALLBACK = retry in plaintext, or a failure."""
        s = self.settings
        relay = session.endpoint.relay
        if not session.supports("starttls"):
            if policy.mandatory:
                return Failure(
                    "4.7.4", f"TLS is required, but was not offered by host {relay}", relay, True
                )
            return None
        conn = session.conn
        failed: BaseException | None = None
        try:
            reply = await conn.command(b"STARTTLS\r\n", s.starttls_timeout)
        except (TimeoutError, ReplyError, OSError) as exc:
            failed = exc
        else:
            if reply.code != 220:
                if not policy.mandatory and conn.is_connected:
                    return None  # STARTTLS refused: carry on in plaintext
                return Failure(
                    "4.7.5",
                    f"STARTTLS refused by host {relay}: {reply.code} {reply.message}",
                    relay,
                    True,
                )
            try:
                context = self.tls.context(policy)
                host = session.endpoint.host
                session.conn = await conn.start_tls(context, host, s.starttls_timeout)
            except (TimeoutError, OSError) as exc:  # ssl.SSLError is an OSError
                failed = exc
        if failed is not None:
            if not policy.mandatory:
                self.log.debug("tls handshake failed, falling back", relay=relay, error=str(failed))
                return FALLBACK
            if isinstance(failed, ssl.SSLError):
                return self._handshake_failure(failed, relay)
            return Failure(
                "4.7.5", f"Cannot start TLS with {relay}: handshake failure: {failed}", relay, True
            )
        session.tls = True
        self.stats.tls_handshakes += 1
        failure = self._check_tls(session, dest, policy)
        if failure is not None:
            return failure
        await self.hello(session)
        return None

    def _handshake_failure(self, exc: ssl.SSLError, relay: str) -> Failure:
        if isinstance(exc, ssl.SSLCertVerificationError):
            detail = f"num={exc.verify_code}:{exc.verify_message}"
            self.log.warning(
                f"Untrusted TLS connection to {relay} not established: "
                f"server certificate verification failed: {detail}"
            )
            return Failure("4.7.5", "Server certificate not trusted", relay, True)
        reason = exc.reason or str(exc)
        self.log.warning(f"TLS handshake with {relay} failed: {reason}")
        return Failure("4.7.5", f"Cannot start TLS: handshake failure ({reason})", relay, True)

    def _check_tls(self, session: Session, dest: Destination, policy: TlsPolicy) -> Failure | None:
        """Check the peer certificate against the policy and log the result line."""
        relay = session.endpoint.relay
        ssl_object = session.conn.get_extra_info("ssl_object")
        summary = describe(ssl_object)
        authenticated = policy.level in ("verify", "secure")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if authenticated:
            peercert = ssl_object.getpeercert() if ssl_object is not None else None
            if not self.tls.check_peer(policy, peercert, dest, session.endpoint):
                self.log.warning(f"Trusted TLS connection established to {relay}: {summary}")
                self.log.warning(
                    f"server certificate verification failed for {relay}: "
                    f"name mismatch (policy match: {', '.join(policy.match) or 'none'})"
                )
                return Failure("4.7.5", "Server certificate not verified", relay, True)
            trust = "Verified"
        else:
            trust = "Untrusted" if der else "Anonymous"
        if self.settings.tls_loglevel >= 1:
            self.log.info(f"{trust} TLS connection established to {relay}: {summary}")
        return None

    async def _quit_quietly(self, session: Session) -> None:
        s = self.settings
        await end_session(session, skip_reply=s.skip_quit_response, timeout=s.quit_timeout)
