"""One SMTP session: aiosmtpd's protocol with qmgrd's MAIL, RCPT and DATA.

aiosmtpd provides the connection handling, the greeting, HELO/EHLO, RSET,
NOOP, QUIT and the timeout. We replace three commands because its versions
do not fit a relay:

- MAIL: aiosmtpd refuses the null sender and every DSN parameter, and
  upper-cases parameter values (ENVID is case-sensitive xtext);
- RCPT: it refuses NOTIFY and ORCPT; we also apply relay control
  (mynetworks), the recipient limit and address syntax checks here;
- DATA: it buffers line by line with a 1001-byte line limit. Ours reads
  the stream in large chunks, finds the terminating ``CRLF . CRLF`` with
  ``bytes.find``, undoes dot-stuffing with one ``replace``, accepts lines of
  any length, bare CR/LF and NULs, and enforces ``message_size_limit``
  without buffering more than a bounded excess.

The reply to DATA is ``250 2.0.0 Ok: queued as ID`` only after the group
committer has made the file durable; a spool failure is ``451 4.3.0``.
Before that, MAIL checks the spool's free space (``statvfs``): when the
message (its SIZE, or nothing) would leave less than ``queue_minfree`` (at
least 64 KiB), the reply is ``452 4.3.1 Insufficient system storage`` and the
client retries later, as with Postfix. Reply codes and texts follow Postfix's
smtpd.

AUTH (``smtpd_sasl_auth_enable``): PLAIN and LOGIN, implemented here rather
than with aiosmtpd's, because the password check must run in a worker thread
and the offer depends on the client (see ``qmgrd.listener.auth``). A client
that authenticated may relay from anywhere. Three failed attempts end the
session with 421.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiosmtpd.smtp import SMTP

from qmgrd.errors import SpoolError
from qmgrd.listener.address import AddressError, parse_path
from qmgrd.listener.auth import auth_allowed, decode_plain
from qmgrd.listener.settings import ListenerSettings
from qmgrd.log import get_logger
from qmgrd.spool import Envelope, GroupCommitter, RecipientSpec

_NOTIFY_WORDS = frozenset({"SUCCESS", "FAILURE", "DELAY"})
_DATA_END = b"\r\n.\r\n"
_READ_SIZE = 1 << 24  # read() returns what is buffered, at most this: empties the buffer
_COMMAND_LIMIT = 4096  # room for ORCPT/ENVID (RFC 3461 §5: up to 500 extra octets)
_MIN_FREE = 65536  # spool bytes MAIL wants free even with queue_minfree = 0 (a queue file)
_AUTH_FAILURE_LIMIT = 3  # failed AUTH attempts before the session is closed
_AUTH_LINE_LIMIT = 12288  # RFC 4954 §4: at least 12288 octets per AUTH line


@dataclass(slots=True, eq=False)
class _Transaction:
    """The state between MAIL and the end of DATA."""

    sender: str
    smtputf8: bool
    body: str | None
    ret: str | None
    envid: str | None
    recipients: list[RecipientSpec] = field(default_factory=list)


class _Handler:
    """aiosmtpd handler hooks: only EHLO, to advertise what our MAIL/RCPT accept."""

    async def handle_EHLO(
        self, server: SMTP, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        session.host_name = hostname
        lines = [r[4:] for r in responses if r[4:] != "HELP" and not r[4:].startswith("AUTH")]
        lines += ["PIPELINING", "ENHANCEDSTATUSCODES", "DSN"]
        if isinstance(server, SMTPSession) and server.auth_offered:
            lines.append("AUTH PLAIN LOGIN")
        return [f"250-{x}" for x in lines[:-1]] + [f"250 {lines[-1]}"]


class SMTPSession(SMTP):
    """One client connection. Collaborators are passed in; nothing is global."""

    line_length_limit = 65536  # StreamReader limit: commands above _COMMAND_LIMIT get 500

    def __init__(
        self,
        settings: ListenerSettings,
        committer: GroupCommitter,
        on_commit: Callable[[str], None],
        sessions: set[SMTPSession],
        *,
        clock: Callable[[], float] = time.time,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(
            _Handler(),
            data_size_limit=settings.message_size_limit or None,
            enable_SMTPUTF8=True,
            decode_data=False,
            hostname=settings.myhostname,
            ident="ESMTP qmgrd",
            timeout=settings.smtpd_timeout,
            loop=loop,
        )
        self.command_size_limits = collections.defaultdict(lambda: _COMMAND_LIMIT)
        self.settings = settings
        self.committer = committer
        self.on_commit = on_commit
        self.sessions = sessions
        self.clock = clock
        self.txn: _Transaction | None = None
        self.client_addr = "unknown"
        self.client = "unknown[unknown]"  # Postfix's name[addr]; no reverse DNS lookup
        self.relay_ok = False
        self.sasl_user: str | None = None  # set by a successful AUTH
        self.sasl_method: str | None = None
        self.auth_failures = 0
        self.log = get_logger("smtpd")

    # -- connection ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        first = self.transport is None
        super().connection_made(transport)
        if first:
            peer = transport.get_extra_info("peername")
            self.client_addr = str(peer[0]) if peer else "unknown"
            self.client = f"unknown[{self.client_addr}]"
            self.relay_ok = self.settings.permits_relay(self.client_addr)
            self.sessions.add(self)

    @property
    def auth_offered(self) -> bool:
        """AUTH is enabled and this channel may carry a clear-text password."""
        if self.settings.sasl_credentials is None:
            return False
        tls = self.transport is not None and (
            self.transport.get_extra_info("sslcontext") is not None
        )
        return auth_allowed(self.client_addr, tls=tls)

    def connection_lost(self, error: Exception | None) -> None:
        self.sessions.discard(self)
        super().connection_lost(error)

    def _set_post_data_state(self) -> None:
        # aiosmtpd's version (untyped) only does this first line; RSET/HELO/EHLO call it too.
        self.envelope = self._create_envelope()
        self.txn = None

    # -- MAIL ----------------------------------------------------------------------

    async def smtp_MAIL(self, arg: str | None) -> None:
        if await self.check_helo_needed():
            return
        if self.txn is not None:
            await self.push("503 5.5.1 Error: nested MAIL command")
            return
        if arg is None or arg[:5].upper() != "FROM:":
            await self.push("501 5.5.4 Syntax: MAIL FROM:<address>")
            return
        try:
            path = parse_path(arg[5:])
        except AddressError:
            await self.push("501 5.1.7 Bad sender address syntax")
            return
        assert self.session is not None
        if path.params and not self.session.extended_smtp:
            await self.push("501 5.5.4 Syntax: MAIL FROM:<address> (parameters need EHLO)")
            return
        params: dict[str, str | None] = {}
        for word in path.params:
            key, eq, value = word.partition("=")
            key = key.upper()
            if key in params:
                await self.push(f"501 5.5.4 Error: duplicate {key} parameter")
                return
            params[key] = value if eq else None
        error = self._check_mail_params(params)
        if error:
            await self.push(error)
            return
        smtputf8 = "SMTPUTF8" in params
        if path.non_ascii and not smtputf8:
            await self.push("553 5.6.7 Must declare SMTPUTF8 to send unicode address")
            return
        size = params.get("SIZE")
        if not self._spool_has_room(int(size) if size else 0):
            self.log.warning(
                "NOQUEUE: reject",
                stage="MAIL",
                client=self.client,
                code="452 4.3.1",
                reason="Insufficient system storage",
                from_=f"<{path.address}>",
            )
            await self.push("452 4.3.1 Insufficient system storage")
            return
        body = params.get("BODY")
        ret = params.get("RET")
        self.txn = _Transaction(
            sender=path.address,
            smtputf8=smtputf8,
            body=body.upper() if body else None,
            ret=ret.upper() if ret else None,
            envid=params.get("ENVID"),
        )
        await self.push("250 2.1.0 Ok")

    def _spool_has_room(self, size: int) -> bool:
        """Whether the spool's file system can take a message of ``size`` bytes now."""
        try:
            st = os.statvfs(self.committer.spool.root)
        except OSError:
            return True  # cannot tell: let the commit decide (451 if it fails)
        free = st.f_bavail * st.f_frsize
        return free >= max(self.settings.queue_minfree, _MIN_FREE) + size

    def _check_mail_params(self, params: dict[str, str | None]) -> str | None:
        for key, value in params.items():
            if key == "SIZE":
                if value is None or not value.isdigit():
                    return "501 5.5.4 Bad SIZE parameter"
                limit = self.settings.message_size_limit
                if limit and int(value) > limit:
                    return "552 5.3.4 Message size exceeds fixed limit"
            elif key == "BODY":
                if value is None or value.upper() not in ("7BIT", "8BITMIME"):
                    return "501 5.5.4 Bad BODY keyword"
            elif key == "SMTPUTF8":
                if value is not None:
                    return "501 5.5.4 Bad SMTPUTF8 parameter"
            elif key == "RET":
                if value is None or value.upper() not in ("FULL", "HDRS"):
                    return "501 5.5.4 Bad RET parameter syntax"
            elif key == "ENVID":
                if not value or len(value) > 100 or not _is_xtext(value):
                    return "501 5.5.4 Bad ENVID parameter syntax"
            else:
                return f"555 5.5.4 Unsupported option: {key}"
        return None

    # -- RCPT ----------------------------------------------------------------------

    async def smtp_RCPT(self, arg: str | None) -> None:
        if await self.check_helo_needed():
            return
        txn = self.txn
        if txn is None:
            await self.push("503 5.5.1 Error: need MAIL command")
            return
        if arg is None or arg[:3].upper() != "TO:":
            await self.push("501 5.5.4 Syntax: RCPT TO:<address>")
            return
        try:
            path = parse_path(arg[3:])
            if not path.address:
                raise AddressError("null recipient")
        except AddressError:
            await self.push("501 5.1.3 Bad recipient address syntax")
            return
        notify: frozenset[str] = frozenset()
        orcpt: str | None = None
        seen: set[str] = set()
        for word in path.params:
            key, eq, value = word.partition("=")
            key = key.upper()
            if key in seen:
                await self.push(f"501 5.5.4 Error: duplicate {key} parameter")
                return
            seen.add(key)
            if key == "NOTIFY":
                words = frozenset(value.upper().split(",")) if eq and value else frozenset()
                if not words or not (words == {"NEVER"} or words <= _NOTIFY_WORDS):
                    await self.push("501 5.5.4 Error: Bad NOTIFY parameter syntax")
                    return
                notify = words
            elif key == "ORCPT":
                addr_type, semi, xtext = value.partition(";")
                if not (eq and semi and addr_type and xtext and len(value) <= 500):
                    await self.push("501 5.5.4 Error: Bad ORCPT parameter syntax")
                    return
                orcpt = value
            else:
                await self.push(f"555 5.5.4 Unsupported option: {key}")
                return
        if path.non_ascii and not txn.smtputf8:
            await self.push("553 5.6.7 Must declare SMTPUTF8 to send unicode address")
            return
        if len(txn.recipients) >= self.settings.smtpd_recipient_limit:
            await self.push("452 4.5.3 Error: too many recipients")
            return
        if not self.relay_ok and self.sasl_user is None:
            self.log.info(
                "NOQUEUE: reject",
                stage="RCPT",
                client=self.client,
                code="554 5.7.1",
                reason="Relay access denied",
                from_=f"<{txn.sender}>",
                to=f"<{path.address}>",
            )
            await self.push(f"554 5.7.1 <{path.address}>: Relay access denied")
            return
        txn.recipients.append(RecipientSpec(path.address, orcpt, notify))
        await self.push("250 2.1.5 Ok")

    # -- AUTH ----------------------------------------------------------------------

    async def smtp_AUTH(self, arg: str | None) -> None:
        """RFC 4954 AUTH with PLAIN or LOGIN (see the module docstring)."""
        if await self.check_helo_needed():
            return
        assert self.session is not None
        creds = self.settings.sasl_credentials
        if creds is None or not self.session.extended_smtp or not self.auth_offered:
            await self.push("503 5.5.1 Error: authentication not enabled")
            return
        if self.sasl_user is not None:
            await self.push("503 5.5.1 Error: already authenticated")
            return
        if self.txn is not None:
            await self.push("503 5.5.1 Error: MAIL transaction in progress")
            return
        mechanism, _, initial = (arg or "").partition(" ")
        mechanism = mechanism.upper()
        if mechanism not in ("PLAIN", "LOGIN"):
            await self.push("504 5.5.4 Unsupported authentication mechanism")
            return
        pair = await self._auth_exchange(mechanism, initial.strip())
        if pair is None:
            return  # the reply was sent
        user, password = pair
        ok = await asyncio.to_thread(creds.verify, user, password)
        if ok:
            self.sasl_user, self.sasl_method = user, mechanism
            self.log.info(
                "authenticated", client=self.client, sasl_method=mechanism, sasl_username=user
            )
            await self.push("235 2.7.0 Authentication successful")
            return
        self.auth_failures += 1
        self.log.warning(
            "SASL authentication failed",
            client=self.client,
            sasl_method=mechanism,
            sasl_username=user,
            reason="authentication failure",
        )
        if self.auth_failures >= _AUTH_FAILURE_LIMIT:
            await self.push("421 4.7.0 Error: too many authentication failures")
            if self.transport is not None:
                self.transport.close()
            return
        await self.push("535 5.7.8 Error: authentication failed: authentication failure")

    async def _auth_exchange(self, mechanism: str, initial: str) -> tuple[str, str] | None:
        """Collect (user, password) for the mechanism; None after replying with an error."""
        if mechanism == "PLAIN":
            blob = await self._auth_response("", initial or None)
            if blob is None:
                return None
            pair = decode_plain(blob)
            if pair is None:
                await self.push("501 5.5.2 Error: malformed PLAIN response")
            return pair
        user_blob = await self._auth_response("VXNlcm5hbWU6", initial or None)  # "Username:"
        if user_blob is None:
            return None
        pass_blob = await self._auth_response("UGFzc3dvcmQ6", None)  # "Password:"
        if pass_blob is None:
            return None
        try:
            return user_blob.decode("utf-8"), pass_blob.decode("utf-8")
        except UnicodeDecodeError:
            await self.push("501 5.5.2 Error: malformed LOGIN response")
            return None

    async def _auth_response(self, challenge: str, given: str | None) -> bytes | None:
        """One decoded client response (the initial one if given, else after a 334)."""
        if given is None:
            await self.push(f"334 {challenge}")
            line = await self._reader.readline()
            if not line.endswith(b"\n"):
                raise ConnectionResetError("connection closed during AUTH")
            if len(line) > _AUTH_LINE_LIMIT:
                await self.push("500 5.5.6 Error: authentication line too long")
                return None
            text = line.strip()
        else:
            text = given.encode("utf-8", "surrogateescape")
        if text == b"*":
            await self.push("501 5.7.0 Error: authentication aborted")
            return None
        if text == b"=":
            return b""  # RFC 4954 §4: "=" is an empty initial response
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            await self.push("501 5.5.2 Error: cannot decode response")
            return None

    # -- DATA ----------------------------------------------------------------------

    async def smtp_DATA(self, arg: str | None) -> None:
        if await self.check_helo_needed():
            return
        txn = self.txn
        if txn is None:
            await self.push("503 5.5.1 Error: need RCPT command")
            return
        if not txn.recipients:
            await self.push("554 5.5.1 Error: no valid recipients")
            return
        if arg:
            await self.push("501 5.5.4 Syntax: DATA")
            return
        await self.push("354 End data with <CR><LF>.<CR><LF>")
        content = await self._read_data()
        self._set_post_data_state()
        limit = self.settings.message_size_limit
        if content is None or (limit and len(content) > limit):
            await self.push("552 5.3.4 Message size exceeds fixed limit")
            return
        arrival = self.clock()
        warn = self.settings.delay_warning_time
        assert self.session is not None
        envelope = Envelope(
            sender=txn.sender,
            recipients=tuple(txn.recipients),
            arrival_time=arrival,
            envid=txn.envid,
            ret=txn.ret,
            smtputf8=txn.smtputf8,
            body=txn.body,
            client_name="unknown",
            client_addr=self.client_addr,
            helo=self.session.host_name,
            warn_time=int(arrival) + warn if warn > 0 else None,
        )
        try:
            queue_id = await self.committer.commit(envelope, content)
        except SpoolError as exc:
            self.log.warning("queue file write error", client=self.client, reason=str(exc))
            await self.push("451 4.3.0 Error: queue file write error")
            return
        self.log.info(
            "queued",
            queue_id=queue_id,
            client=self.client,
            from_=f"<{txn.sender}>",
            size=len(content),
            nrcpt=len(txn.recipients),
            sasl_method=self.sasl_method,
            sasl_username=self.sasl_user,
        )
        self.on_commit(queue_id)
        await self.push(f"250 2.0.0 Ok: queued as {queue_id}")

    async def _read_data(self) -> bytes | None:
        """The message after dot-unstuffing, or None if it exceeded the size limit.

        The stream is searched with a virtual CRLF in front, so the end marker
        is always CRLF "." CRLF, also for an empty message. Bytes after the
        marker (pipelined commands) are handed back to the reader, which is
        empty at that point because every read takes all it holds.
        """
        reader = self._reader
        limit = self.settings.message_size_limit
        cap = limit + limit // 8 + 4096 if limit else 0  # dot-stuffing can add a little
        buf = bytearray(b"\r\n")
        scan = 0
        too_big = False
        while True:
            chunk = await reader.read(_READ_SIZE)
            if not chunk:
                raise ConnectionResetError("connection closed during DATA")
            self._reset_timeout()
            buf += chunk
            end = buf.find(_DATA_END, scan)
            if end >= 0:
                rest = bytes(buf[end + len(_DATA_END) :])
                del buf[end + 2 :]  # keep the CRLF that ends the last line
                if rest:
                    reader.feed_data(rest)
                break
            scan = max(0, len(buf) - len(_DATA_END) + 1)
            if cap and len(buf) > cap:
                too_big = True
                tail = bytes(buf[-4:])
                buf = bytearray(tail)
                scan = 0
        if too_big:
            return None
        return bytes(buf.replace(b"\r\n.", b"\r\n"))[2:]


def _is_xtext(value: str) -> bool:
    """RFC 3461 §4: printable ASCII except "+" and "=", with "+XX" hex escapes."""
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "+":
            hexpart = value[i + 1 : i + 3]
            if len(hexpart) != 2 or any(c not in "0123456789ABCDEF" for c in hexpart):
                return False
            i += 3
            continue
        if not ("!" <= ch <= "~") or ch == "=":
            return False
        i += 1
    return True
