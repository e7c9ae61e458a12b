"""An established SMTP client session and how one command runs on it.

``Session`` is what ``session.Connector.open`` returns: the connection
(``connection.Connection``), the endpoint, the nexthop label, whether TLS is
on, the SASL user and the EHLO keywords. ``Session.key`` is the
connection-cache key: the nexthop label, the endpoint, whether TLS is on and
the SASL user, so an authenticated session is only reused for mail that would
authenticate as the same user.

``end_session(session, skip_reply=, timeout=)`` ends a session as Postfix's
smtp_quit does: QUIT goes out (unless it already went behind the end of data),
its reply is awaited (at most ``smtp_quit_timeout``) only when
``smtp_skip_quit_response`` is off, and the connection is closed whatever happens.
With the default (skip) a server that answers QUIT slowly, or never, costs nothing.

``run_command(session, stage, timeout, *words)`` sends one command and returns
its reply; a timeout, a broken reply or a lost connection raises ``Lost``
(4.4.2, site-level) with Postfix's wording, built by ``broken``:
"conversation with X timed out while STAGE" or "lost connection with X while
STAGE: DETAIL".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qmgrd.delivery.client import Reply, ReplyError, command_line
from qmgrd.delivery.connection import Connection
from qmgrd.delivery.mx import Endpoint
from qmgrd.delivery.replies import Failure, Lost

CacheKey = tuple[str, str, str, int, bool, str]


@dataclass(slots=True, eq=False)
class Session:
    """An established SMTP session after the handshake (TLS and AUTH included)."""

    conn: Connection
    endpoint: Endpoint
    label: str
    tls: bool
    created: float
    user: str = ""  # SASL user the session authenticated as ("" = none)
    reuse_count: int = 0
    extensions: dict[str, str] = field(default_factory=dict)  # EHLO keywords (lower case)
    quit_sent: bool = False  # QUIT went out (behind the end of data); its reply is unread

    @property
    def key(self) -> CacheKey:
        """The connection-cache key (module doc)."""
        ep = self.endpoint
        return (self.label, ep.host, ep.addr, ep.port, self.tls, self.user)

    def supports(self, extension: str) -> bool:
        """Whether the server's EHLO reply advertised ``extension``."""
        return extension.lower() in self.extensions

    def close(self) -> None:
        """Drop the connection at once (after an error, or when QUIT is done)."""
        self.conn.close()


@dataclass(slots=True, eq=False)
class SmtpStats:
    """Counters for tests and benchmarks."""

    connections: int = 0  # TCP connections opened
    tls_handshakes: int = 0  # TLS handshakes completed
    reused: int = 0  # sessions taken from the cache and probed successfully
    deliveries: int = 0


def broken(relay: str, stage: str, exc: BaseException) -> Lost:
    """The ``Lost`` for a timeout or a broken connection or reply while ``stage``."""
    if isinstance(exc, TimeoutError):
        return Lost(
            Failure("4.4.2", f"conversation with {relay} timed out while {stage}", relay, True)
        )
    detail = str(exc) or type(exc).__name__
    return Lost(
        Failure("4.4.2", f"lost connection with {relay} while {stage}: {detail}", relay, True)
    )


async def run_command(session: Session, stage: str, timeout: float, *args: bytes) -> Reply:
    """Run one command; a lost connection or timeout raises ``Lost`` (4.4.2, site)."""
    try:
        return await session.conn.command(command_line(*args), timeout)
    except (TimeoutError, ReplyError, OSError) as exc:
        raise broken(session.endpoint.relay, stage, exc) from None


async def end_session(session: Session, *, skip_reply: bool, timeout: float) -> None:
    """QUIT, the reply awaited only without ``skip_reply``, then close (module doc)."""
    conn = session.conn
    try:
        if not session.quit_sent and conn.is_connected:
            conn.write(b"QUIT\r\n")
            session.quit_sent = True
        if session.quit_sent and not skip_reply:
            await conn.read_reply(timeout)
    except (TimeoutError, ReplyError, OSError):
        pass
    finally:
        session.close()
