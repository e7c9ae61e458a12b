"""The AUTH command of an SMTP session (RFC 4954: PLAIN and LOGIN), moved out of ``commands``.

``auth(session, arg)`` is ``commands.HANDLERS["AUTH"]``; see its docstring for the rules
(where it is offered, the rate limit, the failure limit, Postfix's reply texts).
``MUST_STARTTLS`` is the reply to a command that needs TLS first (shared with ``commands``).
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING

from qmgrd.listener.auth import decode_plain
from qmgrd.listener.protocol import AuthLine, Closed

if TYPE_CHECKING:
    from qmgrd.listener.session import Session

__all__ = ["MUST_STARTTLS", "auth"]

MUST_STARTTLS = "530 5.7.0 Must issue a STARTTLS command first"
_AUTH_FAILURE_LIMIT = 3  # failed AUTH attempts before the session is closed


async def auth(s: Session, arg: str) -> None:
    """RFC 4954 AUTH with PLAIN or LOGIN, checked on the password pool.

    Offered only to TLS (or, unless ``smtpd_tls_auth_only``, loopback) clients;
    at level encrypt AUTH before STARTTLS gets 530 5.7.0. After EHLO, outside a
    transaction, once per session. ``smtpd_client_auth_rate_limit`` AUTH
    commands per ``anvil_rate_time_unit`` per client (outside
    ``smtpd_client_event_limit_exceptions``; counted over every listener
    process when ``ctx.anvil`` is set) get ``450 4.7.1``; three
    failures end the session with 421; a saturated password pool answers
    ``454 4.7.0`` at once.
    """
    creds = s.settings.sasl_credentials
    error = s.dialogue.sequence_error("AUTH")
    if error:
        s.reply(error)
        return
    if s.tls_required() and creds is not None:
        s.reply(MUST_STARTTLS)
        return
    if creds is None or not s.dialogue.extended or not s.auth_offered:
        s.reply("503 5.5.1 Error: authentication not enabled")
        return
    if s.sasl_user is not None:
        s.reply("503 5.5.1 Error: already authenticated")
        return
    limit = s.settings.auth_rate_limit
    if limit and not s.settings.limit_exempt(s.client_addr):
        unit = s.settings.rate_time_unit
        count = s.ctx.counters.auth_event(s.client_addr, s.ctx.clock(), unit)
        if s.ctx.anvil is not None:  # every listener process's count (limits.SharedCounts)
            shared = await s.ctx.anvil.auth_event(s.client_addr, unit)
            count = count if shared is None else shared
        if count > limit:
            s.log.warning(
                "AUTH command rate limit exceeded", count=count, client=s.client, service="smtp"
            )
            s.reply(f"450 4.7.1 Error: too many AUTH commands from {s.client_addr}")
            return
    mechanism, _, initial = arg.partition(" ")
    mechanism = mechanism.upper()
    if mechanism not in ("PLAIN", "LOGIN"):
        s.reply("504 5.5.4 Unsupported authentication mechanism")
        return
    pair = await _auth_exchange(s, mechanism, initial.strip())
    if pair is None:
        return  # the reply was queued
    user, password = pair
    ok = await s.ctx.passwords.check(creds, user, password)
    if ok is None:
        s.log.warning("SASL authentication deferred: password checks saturated", client=s.client)
        s.reply("454 4.7.0 Temporary authentication failure")
        return
    if ok:
        s.sasl_user, s.sasl_method = user, mechanism
        s.log.info("authenticated", client=s.client, sasl_method=mechanism, sasl_username=user)
        s.reply("235 2.7.0 Authentication successful")
        return
    s.auth_failures += 1
    s.ctx.observer.auth_failed(mechanism)
    s.log.warning(
        "SASL authentication failed",
        client=s.client,
        sasl_method=mechanism,
        sasl_username=user,
        reason="authentication failure",
    )
    if s.auth_failures >= _AUTH_FAILURE_LIMIT:
        s.reply("421 4.7.0 Error: too many authentication failures")
        s.end_session()
        return
    s.reply("535 5.7.8 Error: authentication failed: authentication failure")


async def _auth_exchange(s: Session, mechanism: str, initial: str) -> tuple[str, str] | None:
    """Collect (user, password) for the mechanism; None after queueing an error reply."""
    if mechanism == "PLAIN":
        blob = await _auth_response(s, "", initial or None)
        if blob is None:
            return None
        pair = decode_plain(blob)
        if pair is None:
            s.reply("501 5.5.2 Error: malformed PLAIN response")
        return pair
    user_blob = await _auth_response(s, "VXNlcm5hbWU6", initial or None)  # "Username:"
    if user_blob is None:
        return None
    pass_blob = await _auth_response(s, "UGFzc3dvcmQ6", None)  # "Password:"
    if pass_blob is None:
        return None
    try:
        return user_blob.decode("utf-8"), pass_blob.decode("utf-8")
    except UnicodeDecodeError:
        s.reply("501 5.5.2 Error: malformed LOGIN response")
        return None


async def _auth_response(s: Session, challenge: str, given: str | None) -> bytes | None:
    """One decoded client response (the initial one if given, else after a 334)."""
    if given is None:
        s.reply(f"334 {challenge}")
        s.proto.expect_auth_line()
        event = await s.next_event()
        if isinstance(event, Closed):
            raise ConnectionResetError("connection closed during AUTH")
        if not isinstance(event, AuthLine):
            s.reply("500 5.5.6 Error: authentication line too long")
            return None
        text = event.line.strip()
    else:
        text = given.encode("utf-8", "surrogateescape")
    if text == b"*":
        s.reply("501 5.7.0 Error: authentication aborted")
        return None
    if text == b"=":
        return b""  # RFC 4954 §4: "=" is an empty initial response
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        s.reply("501 5.5.2 Error: cannot decode response")
        return None
