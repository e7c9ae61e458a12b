"""The SMTP commands a session answers: one coroutine per verb, Postfix's reply texts.

Each handler takes the ``Session`` (its I/O, dialogue and transaction) and the
command's argument, queues its replies with ``session.reply`` and returns.
Commands not in ``HANDLERS`` get ``502 5.5.2 Error: command not recognized``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from qmgrd.cleanup import decide
from qmgrd.errors import SpoolError
from qmgrd.listener.address import AddressError, parse_path
from qmgrd.listener.authcmd import MUST_STARTTLS, auth
from qmgrd.listener.esmtp import MailParams, parse_mail_params, parse_rcpt_params
from qmgrd.listener.flowgate import FlowFacts
from qmgrd.listener.inflow import OVERLOAD_REPLY
from qmgrd.listener.observer import Committed
from qmgrd.spool.records import RecipientSpec
from qmgrd.spool.writer import EnvelopeHead

if TYPE_CHECKING:
    from qmgrd.listener.session import Session
    from qmgrd.listener.transaction import Transaction

_NO_MAIL_PARAMS = MailParams()  # what parse_mail_params makes of no parameters (frozen)


async def helo(s: Session, arg: str) -> None:
    await _greet(s, arg, extended=False)


async def ehlo(s: Session, arg: str) -> None:
    await _greet(s, arg, extended=True)


async def _greet(s: Session, arg: str, *, extended: bool) -> None:
    name = arg.strip()
    if not name:
        s.reply(f"501 Syntax: {'EHLO' if extended else 'HELO'} hostname")
        return
    await s.abort_transaction()
    s.dialogue.helo(name, extended=extended)
    if not extended:
        s.reply(f"250 {s.settings.myhostname}")
        return
    key = (s.starttls_offered, s.auth_offered)
    replies = s.settings.ehlo_replies.get(key)
    if replies is None:  # once per settings and key: the lines depend on nothing else
        limit = s.settings.message_size_limit
        lines = [s.settings.myhostname, "PIPELINING", f"SIZE {limit}" if limit else "SIZE"]
        if key[0]:
            lines.append("STARTTLS")
        if key[1]:
            lines.append("AUTH PLAIN LOGIN")
        lines += ["ENHANCEDSTATUSCODES", "8BITMIME", "DSN", "SMTPUTF8"]
        texts = (*(f"250-{line}" for line in lines[:-1]), f"250 {lines[-1]}")
        replies = texts, b"".join(t.encode("utf-8", "surrogateescape") + b"\r\n" for t in texts)
        s.settings.ehlo_replies[key] = replies
    s.reply_lines(*replies)


async def mail(s: Session, arg: str) -> None:
    error = s.dialogue.sequence_error("MAIL")
    if error:
        s.reply(error)
        return
    if s.tls_required():
        s.reply(MUST_STARTTLS)
        return
    if arg[:5].upper() != "FROM:":
        s.reply("501 5.5.4 Syntax: MAIL FROM:<address>")
        return
    cleanup = s.settings.cleanup
    try:  # a bare "root" is qualified first (root@$myorigin), as Postfix's cleanup does
        # (the rewriter's bound method is rewrite_sender(cleanup, a))
        path = parse_path(arg[5:], rewrite=cleanup.rewriter.envelope_sender if cleanup else None)
    except AddressError:
        s.reply("501 5.1.7 Bad sender address syntax")
        return
    if path.params and not s.dialogue.extended:
        s.reply("501 5.5.4 Syntax: MAIL FROM:<address> (parameters need EHLO)")
        return
    params = (
        parse_mail_params(path.params, s.settings.message_size_limit)
        if path.params
        else _NO_MAIL_PARAMS
    )
    if isinstance(params, str):
        s.reply(params)
        return
    if path.non_ascii and not params.smtputf8:
        s.reply("553 5.6.7 Must declare SMTPUTF8 to send unicode address")
        return
    if not s.spool_has_room(params.size):
        s.log.warning(
            "NOQUEUE: reject",
            stage="MAIL",
            client=s.client,
            code="452 4.3.1",
            reason="Insufficient system storage",
            from_=f"<{path.address}>",
        )
        s.reply("452 4.3.1 Insufficient system storage")
        return
    facts = FlowFacts(path.address, s.client_addr, s.sasl_user)  # also the commit's (data)
    refused = s.ctx.gate.refuse(facts)
    if refused is not None:  # this flow has too much mail waiting (qmgrd.listener.flowgate)
        s.log.warning("NOQUEUE: reject", stage="MAIL", client=s.client, code=refused[:9],
                      reason=refused[10:], from_=f"<{path.address}>")
        s.reply(refused)
        return
    if not await s.ctx.inflow.admit_message():  # regulator: in_flow_delay, then capacity
        s.log.warning("NOQUEUE: reject", stage="MAIL", client=s.client, code="421 4.3.2",
                      reason="over capacity")  # fmt: skip
        s.reply(OVERLOAD_REPLY)
        s.end_session()
        return
    arrival = s.ctx.clock()  # Postfix's arrival time is MAIL's too
    warn = s.settings.delay_warning_time
    s.begin_transaction(
        EnvelopeHead(
            sender=path.address,
            arrival_time=arrival,
            envid=params.envid,
            ret=params.ret,
            smtputf8=params.smtputf8,
            body=params.body,
            client_name="unknown",
            client_addr=s.client_addr,
            helo=s.dialogue.helo_name,
            warn_time=int(arrival) + warn if warn > 0 else None,
            sasl_username=s.sasl_user,
        ),
        facts,
    )
    s.reply("250 2.1.0 Ok")


async def rcpt(s: Session, arg: str) -> None:
    error = s.dialogue.sequence_error("RCPT")
    txn = s.txn
    if s.tls_required() and not error:
        s.reply(MUST_STARTTLS)
        return
    if error or txn is None:
        s.reply(error or "503 5.5.1 Error: need MAIL command")
        return
    if arg[:3].upper() != "TO:":
        s.reply("501 5.5.4 Syntax: RCPT TO:<address>")
        return
    cleanup = s.settings.cleanup
    try:
        path = parse_path(
            arg[3:],
            recipient=True,
            rewrite=cleanup.rewriter.envelope_recipient if cleanup else None,  # rewrite_recipient
        )
        if not path.address:
            raise AddressError("null recipient")
    except AddressError:
        s.reply("501 5.1.3 Bad recipient address syntax")
        return
    spec: RecipientSpec | str = (  # no parameters: what parse_rcpt_params would make
        parse_rcpt_params(path.address, path.params) if path.params else RecipientSpec(path.address)
    )
    if isinstance(spec, str):
        s.reply(spec)
        return
    if path.non_ascii and not txn.smtputf8:
        s.reply("553 5.6.7 Must declare SMTPUTF8 to send unicode address")
        return
    if txn.failed:
        s.reply("451 4.3.0 Error: queue file write error")
        return
    if txn.file.rcpt_count >= s.settings.smtpd_recipient_limit:
        s.reply("452 4.5.3 Error: too many recipients")
        return
    if not s.relay_ok and s.sasl_user is None:
        s.log.info(
            "NOQUEUE: reject",
            stage="RCPT",
            client=s.client,
            code="554 5.7.1",
            reason="Relay access denied",
            from_=f"<{txn.sender}>",
            to=f"<{path.address}>",
        )
        s.reply(f"554 5.7.1 <{path.address}>: Relay access denied")
        return
    txn.file.add_recipient(spec)
    txn.given.append(path.given)
    if not await s.write_out(txn):
        s.reply("451 4.3.0 Error: queue file write error")
        return
    s.dialogue.move("rcpt")
    s.reply("250 2.1.5 Ok")


async def data(s: Session, arg: str) -> None:
    error = s.dialogue.sequence_error("DATA")
    txn = s.txn
    if s.tls_required() and not error:
        s.reply(MUST_STARTTLS)
        return
    if error or txn is None:
        s.reply(error or "503 5.5.1 Error: need RCPT command")
        return
    if arg:
        s.reply("501 5.5.4 Syntax: DATA")
        return
    if txn.failed:
        await s.abort_transaction()
        s.reply("451 4.3.0 Error: queue file write error")
        return
    s.start_cleanup(txn)
    s.reply("354 End data with <CR><LF>.<CR><LF>")
    too_big, failed = await s.read_data(txn)
    s.txn = None
    s.dialogue.move("end")
    if too_big or failed:  # the writer has removed its file already
        s.reply(
            "552 5.3.4 Message size exceeds fixed limit"
            if too_big
            else "451 4.3.0 Error: queue file write error"
        )
        return
    decision = decide(txn.cleanup.outcome) if txn.cleanup is not None else None
    if decision is not None and not decision.store:  # REJECT, too many hops, DISCARD
        await s.disk(txn.file.discard)
        s.reply(decision.reply or f"250 2.0.0 Ok: queued as {txn.file.queue_id}")
        return
    hold = decision is not None and decision.hold
    if decision is not None and decision.recipients:
        txn.file.replace_recipients([RecipientSpec(r) for r in decision.recipients])
    if hold:
        txn.file.target = "hold"  # committed straight into hold/: no scan can take it
    try:
        queue_id = await s.ctx.committer.commit_writer(txn.file)
    except SpoolError as exc:
        s.log.warning("queue file write error", client=s.client, reason=str(exc))
        s.reply("451 4.3.0 Error: queue file write error")
        return
    s.log.info(
        "queued",
        queue_id=queue_id,
        client=s.client,
        from_=f"<{txn.sender}>",
        size=txn.file.content_size,
        nrcpt=txn.file.rcpt_count,
        sasl_method=s.sasl_method,
        sasl_username=s.sasl_user,
    )
    if not hold:
        # MAIL's facts: sender and client are the transaction's, and AUTH (or STARTTLS,
        # which drops the AUTH identity) is refused while a transaction is open
        facts = txn.facts or FlowFacts(txn.sender, s.client_addr, s.sasl_user)
        s.ctx.gate.committed(queue_id, facts)
        s.ctx.on_commit(_committed(s, txn, queue_id))
    s.ctx.observer.message_accepted(txn.file.rcpt_count)
    s.junk = 0  # Postfix: the junk count is reset after mail is delivered
    s.reply(f"250 2.0.0 Ok: queued as {queue_id}")


def _committed(s: Session, txn: Transaction, queue_id: str) -> Committed:
    return Committed(queue_id, txn.sender, s.client_addr, s.sasl_user, txn.file.rcpt_count)


async def rset(s: Session, arg: str) -> None:
    await s.abort_transaction()
    s.reply("250 2.0.0 Ok")


async def noop(s: Session, arg: str) -> None:
    s.reply("250 2.0.0 Ok")


async def vrfy(s: Session, arg: str) -> None:
    s.reply("502 5.5.1 VRFY command is disabled")


async def starttls(s: Session, arg: str) -> None:
    """RFC 3207 STARTTLS: 220, the handshake, then a new dialogue (``Session.starttls``)."""
    if not s.starttls_offered:
        s.reply(
            "554 5.5.1 Error: TLS already active"
            if s.tls is not None
            else "502 5.5.1 Error: command not implemented"
        )
        return
    if arg:
        s.reply("501 5.5.4 Syntax: STARTTLS")
        return
    if s.dialogue.in_transaction:
        s.reply("503 5.5.1 Error: MAIL transaction in progress")
        return
    await s.starttls()


async def quit_(s: Session, arg: str) -> None:
    await s.abort_transaction()
    s.reply("221 2.0.0 Bye")
    s.end_session()


Handler = Callable[["Session", str], Awaitable[None]]
HANDLERS: dict[str, Handler] = {
    "HELO": helo,
    "EHLO": ehlo,
    "MAIL": mail,
    "RCPT": rcpt,
    "DATA": data,
    "RSET": rset,
    "NOOP": noop,
    "VRFY": vrfy,
    "QUIT": quit_,
    "AUTH": auth,
    "STARTTLS": starttls,
}
