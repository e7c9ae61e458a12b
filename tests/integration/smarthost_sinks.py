"""Smarthost sinks for integration tests: AUTH, implicit TLS and peer recording.

``smarthost_sink(SmarthostConfig(...))`` starts a ``SinkServer`` (see sinks.py)
whose sessions also:

- offer AUTH PLAIN and LOGIN (aiosmtpd's), and CRAM-MD5 with ``cram_md5``,
  with ``users`` (login → password);
  ``auth_require_tls`` hides AUTH until STARTTLS, ``auth_required`` refuses
  MAIL with 530 until a client authenticated; every attempt is recorded in
  ``auth_attempts`` as (mechanism, login, password, tls) so a test can check
  that no credentials crossed a plaintext connection;
- with ``implicit_tls`` speak TLS from the first byte (SMTPS, port 465);
- record each client's address in ``peers`` (for ``smtp_bind_address``) and
  the EHLO names in ``helo_names``; ``tls_connections`` counts connections
  that were TLS from the first byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session

from tests.integration.sinks import SinkConfig, SinkServer, _SinkSMTP


@dataclass(slots=True)
class SmarthostConfig:
    """AUTH and TLS knobs on top of a ``SinkConfig``."""

    sink: SinkConfig = field(default_factory=SinkConfig)
    users: dict[str, str] = field(default_factory=dict)
    auth_required: bool = True
    auth_require_tls: bool = True
    implicit_tls: ssl.SSLContext | None = None
    cram_md5: bool = False  # also offer CRAM-MD5 (checked against ``users``)


@dataclass(frozen=True, slots=True)
class AuthAttempt:
    """One AUTH exchange as the server saw it."""

    mechanism: str
    login: str
    password: str
    tls: bool
    ok: bool


class _SmarthostSMTP(_SinkSMTP):
    """The sink protocol, recording peers and EHLO names."""

    def __init__(self, server: SmarthostServer, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self._smarthost = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        if peer and not self._counted:
            self._smarthost.peers.append(str(peer[0]))
            if transport.get_extra_info("ssl_object") is not None:
                self._smarthost.tls_connections += 1
        super().connection_made(transport)

    async def smtp_EHLO(self, hostname: str) -> None:
        self._smarthost.helo_names.append(hostname)
        await super().smtp_EHLO(hostname)

    async def auth_CRAM__MD5(self, _server: Any, args: list[str]) -> AuthResult:
        challenge = b"<1896.697170952@smarthost.test>"
        response = await self.challenge_auth(challenge)
        if not isinstance(response, bytes):
            return AuthResult(success=False)
        login, _sep, digest = response.decode("utf-8", "replace").partition(" ")
        secret = self._smarthost.smarthost.users.get(login)
        expected = hmac.new(secret.encode(), challenge, "md5").hexdigest() if secret else None
        ok = expected is not None and hmac.compare_digest(expected, digest)
        tls = self.session is not None and self.session.ssl is not None
        self._smarthost.auth_attempts.append(AuthAttempt("CRAM-MD5", login, "", tls, ok))
        return AuthResult(success=ok, handled=False)


class SmarthostServer(SinkServer):
    """A ``SinkServer`` with AUTH, optional implicit TLS and peer recording."""

    def __init__(self, config: SmarthostConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(config.sink, host, port)
        self.smarthost = config
        self.auth_attempts: list[AuthAttempt] = []
        self.peers: list[str] = []
        self.helo_names: list[str] = []
        self.tls_connections = 0  # connections that were TLS from the first byte

    def _authenticate(
        self, server: Any, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        if not isinstance(data, LoginPassword):
            return AuthResult(success=False, handled=False)
        login = data.login.decode("utf-8", "replace")
        password = data.password.decode("utf-8", "replace")
        ok = self.smarthost.users.get(login) == password
        self.auth_attempts.append(
            AuthAttempt(mechanism, login, password, session.ssl is not None, ok)
        )
        return AuthResult(success=ok, handled=False)

    def _protocol(self) -> _SinkSMTP:
        cfg = self.config
        return _SmarthostSMTP(
            self,
            hostname="smarthost.test",
            ident="qmgrd-test-smarthost",
            tls_context=None if self.smarthost.implicit_tls else cfg.tls_context,
            enable_SMTPUTF8=cfg.smtputf8,
            data_size_limit=cfg.size_limit,
            authenticator=self._authenticate,
            auth_required=self.smarthost.auth_required,
            auth_require_tls=self.smarthost.auth_require_tls,
            auth_exclude_mechanism=[] if self.smarthost.cram_md5 else ["CRAM-MD5"],
            loop=asyncio.get_running_loop(),
        )

    async def start(self) -> None:
        """Listen (with TLS from the first byte when ``implicit_tls`` is set)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._protocol, self.host, self.port, ssl=self.smarthost.implicit_tls
        )
        self.port = self._server.sockets[0].getsockname()[1]


@contextlib.asynccontextmanager
async def smarthost_sink(
    config: SmarthostConfig, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[SmarthostServer]:
    """A started ``SmarthostServer``, stopped on exit."""
    server = SmarthostServer(config, host, port)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
