"""One SMTP mail transaction on an open session: MAIL, RCPT, DATA (notes §10.4).

``wire_address(address, smtputf8)`` is the address exactly as it goes on the
wire, or the reason it cannot go: a control character (even one the client
escaped in a quoted local part: RFC 5321 §4.1.2
allows none), bytes that are not UTF-8, or 8-bit characters in a message
without SMTPUTF8. An address is never changed on the way out; one that cannot
be sent as is fails that message (sender) or that recipient, permanently, and
is never a destination failure. The agent checks every address before it
connects.

``Transaction(settings).run(attempt, session)`` sends the pending recipients'
transaction and returns whether the session may be reused. Replies to MAIL,
RCPT and DATA are recipient or message results; 421 and lost connections are
site-level (``Lost``).

``probe=True`` (a session taken from the connection cache): RSET goes first, as
Postfix probes a cached session before reuse; with PIPELINING it rides at the
head of the envelope's group (RFC 2920 allows RSET anywhere in a group), so the
probe costs no round trip of its own. When the probe fails (no reply within
``smtp_rset_timeout``, a lost connection, a reply other than 250) nothing has
been recorded and nothing can have been delivered (no end of data was sent):
``StaleSession`` is raised and the caller closes the session and tries another.

On the way out (``SmtpSettings.outbound``, `qmgrd.cleanup.outbound`): the
envelope sender and recipients go through ``smtp_generic_maps`` (checked as
rewritten), and when ``smtp_generic_maps`` or ``smtp_header_checks`` is set
the header section is streamed through an ``OutboundFilter`` (one header
held at a time, at most ``header_size_limit``; the body untouched). Without
them the queue file's bytes are sent exactly as before.

The envelope (``client.Envelope``): when the server offers PIPELINING (RFC
2920), MAIL FROM, every RCPT TO and DATA go out in one write and the replies
are matched in order; otherwise one command at a time. Each reply is awaited
with its command's timeout (``smtp_mail_timeout``, ``smtp_rcpt_timeout``,
``smtp_data_init_timeout``).

Content streaming: after 354 the content (``data`` when the source holds it in
memory and it fits one chunk: no async iteration) is read in chunks of up to
``CONTENT_CHUNK`` bytes (256 KiB: most mail is one read, one encoding pass and
one write), encoded by ``content.DataEncoder`` and written chunk by chunk with
flow control (each wait for the transport at
most ``smtp_data_xfer_timeout``); the last chunk goes out with the end of data
in one ``writelines`` (one system call, no joined copy), and the final reply is
awaited ``smtp_data_done_timeout``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from qmgrd.delivery.agent import DeliveryRequest
from qmgrd.delivery.attempt import Attempt
from qmgrd.delivery.client import Envelope, Reply, ReplyError, Step, command_line
from qmgrd.delivery.content import DataEncoder
from qmgrd.delivery.replies import Failure, Lost, dsn_param, reply_dsn, reply_text
from qmgrd.delivery.session import Session, broken, run_command
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.errors import InvariantError

_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")  # bytes no address may carry on the wire
CONTENT_CHUNK = 256 * 1024  # bytes per content read: bounds a delivery's buffers


class StaleSession(Exception):
    """A cached session failed its RSET probe: close it; nothing was recorded (module doc)."""


class ContentError(Exception):
    """The content could not be read from the queue: a local problem, not the server's."""


def wire_address(address: str, smtputf8: bool) -> bytes | str:
    """The address's bytes as received, or why it cannot be sent as is."""
    raw = address.encode("utf-8", "surrogateescape")
    if _CONTROL.search(raw):
        return "it contains a control character"
    if raw.isascii():  # most addresses: valid UTF-8 and 7-bit
        return raw
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return "it is not valid UTF-8"
    if not smtputf8:
        return "it has 8-bit characters but the message was not received with SMTPUTF8"
    return raw


def check_addresses(
    att: Attempt, rewrite: Callable[[str], str] | None = None
) -> dict[int, bytes] | None:
    """Wire forms of the pending recipients; bad ones (or all, for a bad sender) bounce.

    ``rewrite`` is ``smtp_generic_maps`` (`Outbound.address`): the addresses are
    checked as they will be sent.
    """
    req = att.request
    sender = wire_address(rewrite(req.sender) if rewrite else req.sender, req.smtputf8)
    if isinstance(sender, str):
        att.fail_pending(Failure("5.1.7", f"sender address cannot be sent as is: {sender}", "none"))
        return None
    out: dict[int, bytes] = {}
    for idx, rcpt in list(att.pending.items()):
        wire = wire_address(rewrite(rcpt.address) if rewrite else rcpt.address, req.smtputf8)
        if isinstance(wire, str):
            att.fail(idx, Failure("5.1.3", f"recipient address cannot be sent as is: {wire}"))
        else:
            out[idx] = wire
    return out


class Transaction:
    """MAIL, RCPT and DATA with the agent's timeouts."""

    def __init__(self, settings: SmtpSettings) -> None:
        """Keep the settings (timeouts, ``smtp_generic_maps``, ``smtp_header_checks``)."""
        self.settings = settings
        outbound = settings.outbound
        # smtp_generic_maps, or None: most transports have none (no call per address)
        self.rewrite: Callable[[str], str] | None = (
            outbound.address if outbound.generic_maps else None
        )
        self._filtering = outbound.active  # smtp_header_checks or smtp_generic_maps

    async def run(
        self,
        att: Attempt,
        session: Session,
        wire: dict[int, bytes],
        *,
        last: bool = False,
        probe: bool = False,
    ) -> bool:
        """The transaction for the pending recipients; True if the session is reusable.

        ``last``: the session ends after this transaction. With PIPELINING, QUIT then
        goes out in the same write as the end of data (``session.quit_sent``), as
        Postfix's client pipelines it; the caller ends the session (``end_session``:
        the reply is read only without ``smtp_skip_quit_response``).
        """
        try:
            return await self._steps(att, session, wire, last, probe)
        except Lost as lost:
            session.close()
            att.fail_pending(lost.failure)
            return False
        except ContentError as exc:
            session.close()
            att.fail_pending(Failure("4.3.0", f"error reading message content: {exc}"))
            return False

    async def _steps(
        self, att: Attempt, session: Session, wire: dict[int, bytes], last: bool, probe: bool
    ) -> bool:
        req = att.request
        relay = session.endpoint.relay
        extensions = session.extensions  # EHLO keywords, lower case
        pipelining = "pipelining" in extensions
        if probe and not pipelining:
            await self._probe(session)

        def said(response: Reply, command: str) -> Failure:
            return Failure(
                reply_dsn(response.code, response.message),
                f"host {relay} said: {reply_text(response)} (in reply to {command} command)",
                relay,
                site=response.code == 421,
            )

        if req.smtputf8 and "smtputf8" not in extensions:
            att.fail_pending(
                Failure(
                    "5.6.7", f"SMTPUTF8 is required, but was not offered by host {relay}", relay
                )
            )
            return True
        size_limit = extensions.get("size", "")
        if size_limit.isdigit() and 0 < int(size_limit) < req.content.size:
            att.fail_pending(
                Failure(
                    "5.3.4",
                    f"message size {req.content.size} exceeds size limit {size_limit} "
                    f"of server {relay}",
                    relay,
                )
            )
            return True

        dsn_ext = "dsn" in extensions
        options: list[bytes] = []
        if "size" in extensions:
            options.append(f"SIZE={req.content.size}".encode())
        if req.body_8bitmime and "8bitmime" in extensions:
            options.append(b"BODY=8BITMIME")
        if req.smtputf8:
            options.append(b"SMTPUTF8")
        if dsn_ext and req.ret:
            options.append(f"RET={req.ret}".encode())
        if dsn_ext and req.envid:
            options.append(f"ENVID={dsn_param(req.envid)}".encode())

        # smtp_generic_maps; checked by check_addresses
        rewrite = self.rewrite
        sender = (rewrite(req.sender) if rewrite else req.sender).encode("utf-8", "surrogateescape")
        rcpts: list[tuple[int, bytes]] = []
        for idx, rcpt in att.pending.items():
            rcpt_options: list[bytes] = []
            if dsn_ext and rcpt.notify:
                rcpt_options.append(("NOTIFY=" + ",".join(sorted(rcpt.notify))).encode())
            if dsn_ext and rcpt.orcpt:
                addr_type, _, addr = rcpt.orcpt.partition(";")
                rcpt_options.append(f"ORCPT={addr_type};{dsn_param(addr)}".encode())
            rcpts.append((idx, command_line(b"RCPT", b"TO:<" + wire[idx] + b">", *rcpt_options)))
        envelope = Envelope(
            command_line(b"MAIL", b"FROM:<" + sender + b">", *options),
            rcpts,
            pipelining=pipelining,
            probe=probe and pipelining,
        )
        await self._exchange(session, envelope, said)

        if envelope.mail_reply is None:  # _exchange returns only when every reply is in
            raise InvariantError("envelope finished without a MAIL FROM reply")
        if not envelope.mail_ok:
            att.fail_pending(said(envelope.mail_reply, "MAIL FROM"))
        else:
            for idx, _line in rcpts:
                response = envelope.rcpt_replies[idx]
                if response.code // 100 != 2:
                    att.fail(idx, said(response, "RCPT TO"))
        accepted = envelope.accepted
        data = envelope.data_reply
        if not accepted or data is None:
            att.completed = True
            if envelope.data_unwanted and not await self._end_unwanted(session):
                return False
            return await self._reset(session)
        if data.code != 354:
            for idx in accepted:
                att.fail(idx, said(data, "DATA"))
            att.completed = True
            return await self._reset(session)

        with_quit = last and envelope.pipelining
        response = await self._send_content(session, req, with_quit=with_quit)
        if response.code == 421:
            raise Lost(said(response, "end of DATA"))
        att.completed = True
        if response.code // 100 == 2:
            att.sent(accepted, response, relay)
            return True
        for idx in accepted:
            att.fail(idx, said(response, "end of DATA"))
        return True

    async def _exchange(
        self, session: Session, envelope: Envelope, said: Callable[[Reply, str], Failure]
    ) -> None:
        """Write the envelope's commands and read their replies; 421 raises ``Lost``."""
        s = self.settings
        conn = session.conn
        pipelining = envelope.pipelining
        out = envelope.to_send()
        step = envelope.expected()
        while step is not None:
            kind = step[0]
            # Identity tests, not a dict of timeouts: an Enum's hash is a Python call.
            if kind is Step.RCPT:
                timeout = s.rcpt_timeout
            elif kind is Step.MAIL:
                timeout = s.mail_timeout
            elif kind is Step.DATA:
                timeout = s.data_init_timeout
            else:
                timeout = s.rset_timeout
            try:
                if out is not None:
                    conn.write(out)
                    out = None
                reply = conn.next_reply()  # a pipelined group's replies come in one read
                if reply is None:
                    reply = await conn.read_reply(timeout)
            except (TimeoutError, ReplyError, OSError) as exc:
                if kind is Step.RSET:
                    raise StaleSession(str(exc) or type(exc).__name__) from None
                raise broken(session.endpoint.relay, f"sending {kind.value}", exc) from None
            if kind is Step.RSET and reply.code != 250:
                raise StaleSession(f"{reply.code} {reply.message}")
            if reply.code == 421:
                raise Lost(said(reply, kind.value))
            step = envelope.receive(reply)
            if not pipelining:  # pipelined, the whole group went out in the first write
                out = envelope.to_send()
                step = envelope.expected()

    async def _probe(self, session: Session) -> None:
        """RSET on its own (no PIPELINING); ``StaleSession`` unless it is answered 250."""
        try:
            reply = await session.conn.command(b"RSET\r\n", self.settings.rset_timeout)
        except (TimeoutError, ReplyError, OSError) as exc:
            raise StaleSession(str(exc) or type(exc).__name__) from None
        if reply.code != 250:
            raise StaleSession(f"{reply.code} {reply.message}")

    async def _end_unwanted(self, session: Session) -> bool:
        """A pipelined DATA got 354 with no recipient: end it with a lone ".".

        Postfix's smtp_proto.c does the same (RFC 2920 §3.1); a server with no
        recipients rejects the empty message. The caller then RSETs (Postfix
        goes straight on to QUIT or the cache). False when the session broke.
        """
        try:
            await run_command(session, "sending end of data", self.settings.data_done_timeout, b".")
        except Lost:
            return False
        return True

    async def _reset(self, session: Session) -> bool:
        """RSET after a failed transaction so the session can be reused."""
        try:
            response = await run_command(
                session, "sending RSET", self.settings.rset_timeout, b"RSET"
            )
        except Lost:
            return False
        return response.code == 250

    async def _send_content(
        self, session: Session, req: DeliveryRequest, *, with_quit: bool = False
    ) -> Reply:
        """Stream the content after 354, then read the final reply (``with_quit``: QUIT follows)."""
        s = self.settings
        conn = session.conn
        encoder = DataEncoder()
        # smtp_generic_maps / smtp_header_checks: one bounded pass over the header section
        headers = s.outbound.filter(req.queue_id) if self._filtering else None
        stage = "sending message body"
        # The last encoded chunk is held back and sent with the end of data: a message
        # of one chunk (most mail) costs one write, one segment and one wake-up of the server.
        held = b""
        whole = req.content.data  # in memory already (the load read it), or None
        try:
            if whole is not None and len(whole) <= CONTENT_CHUNK:
                # What chunks() would yield (one chunk, none if empty), without an async
                # generator: most mail is small and the queue manager's load read it.
                if whole:
                    held = encoder.feed(headers.feed(whole) if headers is not None else whole)
            else:
                iterator = aiter(req.content.chunks(CONTENT_CHUNK))
                while True:
                    try:
                        chunk = await anext(iterator)
                    except StopAsyncIteration:
                        break
                    except Exception as exc:
                        raise ContentError(str(exc)) from exc
                    data = encoder.feed(headers.feed(chunk) if headers is not None else chunk)
                    if data:
                        if held:
                            conn.write(held)
                            # Flow control: wait while the transport buffer is over its mark.
                            await conn.drain(s.data_xfer_timeout)
                        held = data
            tail = encoder.feed(headers.finish()) if headers is not None else b""
            end = tail + encoder.finish() + (b"QUIT\r\n" if with_quit else b"")
            conn.writelines((held, end))  # one system call, the chunk not copied to join it
            session.quit_sent = with_quit
            stage = "sending end of data -- message may be sent more than once"
            return await conn.read_reply(s.data_done_timeout)
        except (TimeoutError, ReplyError, OSError) as exc:
            raise broken(session.endpoint.relay, stage, exc) from None
