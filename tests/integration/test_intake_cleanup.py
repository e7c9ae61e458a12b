"""Cleanup wired into the real SMTP listener and the daemon, end to end on 127.0.0.1.

Every message here goes through qmgrd's own listener (no stand-in): trace
headers and missing headers, envelope qualification, header_checks actions at
intake, smtp_generic_maps on the way out, the hop count on a route back to
the daemon itself, the pickup started by the daemon (sendmail -t -i against
``qmgrd run``), and the smtpd session log lines.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import aiosmtplib
import pytest

from qmgrd.spool import Spool
from tests.integration.e2e import TIMEOUT, running_daemon, wait_for_messages, write_config
from tests.integration.sinks import SinkServer, smtp_sink
from tests.integration.test_cli_ops import cli
from tests.support.links import record_placements
from tests.support.logs import watch_logs
from tests.support.process import DaemonProcess

REPO = Path(__file__).resolve().parents[2]
RAW = b"Subject: raw local\r\n\r\nbody\r\n"
SPAM = b"Subject: spam\r\n\r\nx\r\n"
LOOP = b"Subject: loop\r\n\r\nx\r\n"


def _relay(sink: SinkServer, extra: str = "") -> str:
    return f"relayhost = {sink.nexthop}\n{extra}"


async def _send(port: int, sender: str, rcpts: list[str], content: bytes) -> tuple[int, str]:
    """One transaction over SMTP; the final (code, text) of DATA."""
    async with aiosmtplib.SMTP(
        hostname="127.0.0.1", port=port, timeout=TIMEOUT, start_tls=False
    ) as client:
        await client.ehlo()
        await client.mail(sender)
        for rcpt in rcpts:
            await client.rcpt(rcpt)
        try:
            reply = await client.data(content)
        except aiosmtplib.SMTPDataError as exc:
            return exc.code, exc.message
        return reply.code, reply.message


def _headers(content: bytes) -> list[bytes]:
    head = content.split(b"\r\n\r\n", 1)[0]
    return re.split(rb"\r\n(?![ \t])", head)


async def test_local_raw_message_gets_missing_headers_and_one_received(tmp_path: Path) -> None:
    """MAIL FROM:<root> becomes root@$myorigin; Date, Message-Id, From and one Received added."""
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, _relay(sink, "myorigin = origin.test\n"))
        async with running_daemon(conf) as d:
            code, text = await _send(d.port, "root", ["r@dst.test"], RAW)
            assert code == 250, text
            qid = text.rsplit(" ", 1)[-1]
            await wait_for_messages(sink, 1)
    [msg] = sink.messages
    assert msg.mail_from == "root@origin.test"
    headers = _headers(msg.content)
    received = [h for h in headers if h.lower().startswith(b"received:")]
    assert len(received) == 1 and f"id {qid}".encode() in received[0]
    names = {h.split(b":", 1)[0].lower() for h in headers}
    assert {b"date", b"message-id", b"from"} <= names
    assert b"From: root@origin.test" in headers
    [mid] = [h for h in headers if h.lower().startswith(b"message-id:")]
    assert f".{qid}@mx.test>".encode() in mid


async def test_non_local_client_headers_not_rewritten(tmp_path: Path) -> None:
    """local_header_rewrite_clients = static:none: only Received: is added, From: left as sent."""
    content = b"From: root\r\nSubject: s\r\n\r\nbody\r\n"
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, _relay(sink, "local_header_rewrite_clients = static:none\n"))
        async with running_daemon(conf) as d:
            code, text = await _send(d.port, "a@src.test", ["r@dst.test"], content)
            assert code == 250, text
            await wait_for_messages(sink, 1)
    [msg] = sink.messages
    headers = _headers(msg.content)
    assert headers[0].startswith(b"Received: from ")
    assert headers[1:] == [b"From: root", b"Subject: s"]


def _checks(tmp_path: Path, rule: str) -> str:
    table = tmp_path / "header_checks"
    table.write_text(f"/^Subject: .*spam/ {rule}\n")
    return f"header_checks = regexp:{table}\n"


async def test_header_checks_reject_at_intake(tmp_path: Path) -> None:
    """REJECT: 550 with the table's text after DATA, and nothing stored."""
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, _relay(sink, _checks(tmp_path, "REJECT no spam here")))
        async with running_daemon(conf) as d:
            code, text = await _send(d.port, "a@src.test", ["r@dst.test"], SPAM)
            assert (code, text) == (550, "5.7.1 no spam here")
            # the session goes on: a clean message is accepted afterwards
            code, _ = await _send(d.port, "a@src.test", ["r@dst.test"], b"Subject: ok\r\n\r\nx\r\n")
            assert code == 250
            await wait_for_messages(sink, 1)
            await d.wait_idle()
            assert all(not d.queue_ids(q) for q in ("incoming", "active", "deferred", "hold"))
    assert [b"Subject: ok" in m.content for m in sink.messages] == [True]


async def test_header_checks_hold_commits_into_hold_then_release_delivers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HOLD: 250 queued as ID, committed straight into hold/; ``qmgrd release ID`` delivers it."""
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, _relay(sink, _checks(tmp_path, "HOLD look at it")))
        async with running_daemon(conf) as d:
            placed = record_placements(monkeypatch)
            code, text = await _send(d.port, "a@src.test", ["r@dst.test"], SPAM)
            assert code == 250, text
            qid = text.rsplit(" ", 1)[-1]
            assert placed == [d.spool.root / "hold" / qid]  # never placed in incoming/
            await d.wait_idle()
            assert d.queue_ids("hold") == [qid]
            assert d.queue_ids("incoming") == [] and d.queue_ids("deferred") == []
            assert sink.messages == []
            code, _, err = await cli(conf, "release", qid)
            assert (code, err) == (0, "")
            await wait_for_messages(sink, 1)
            await d.wait_idle()
            assert all(not d.queue_ids(q) for q in ("incoming", "active", "deferred", "hold"))
    [msg] = sink.messages
    assert msg.rcpt_tos == ["r@dst.test"] and b"Subject: spam" in msg.content


async def test_header_checks_discard_stores_nothing(tmp_path: Path) -> None:
    """DISCARD: the client gets 250, nothing is stored or delivered."""
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, _relay(sink, _checks(tmp_path, "DISCARD")))
        async with running_daemon(conf) as d:
            code, text = await _send(d.port, "a@src.test", ["r@dst.test"], SPAM)
            assert code == 250, text
            await d.wait_idle()
            assert all(not d.queue_ids(q) for q in ("incoming", "active", "deferred", "hold"))
    assert sink.messages == []


async def test_header_checks_redirect_replaces_recipients(tmp_path: Path) -> None:
    """REDIRECT: the message goes only to the table's address."""
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, _relay(sink, _checks(tmp_path, "REDIRECT abuse@dst.test")))
        async with running_daemon(conf) as d:
            code, text = await _send(d.port, "a@src.test", ["r1@dst.test", "r2@dst.test"], SPAM)
            assert code == 250, text
            await wait_for_messages(sink, 1)
    assert [m.rcpt_tos for m in sink.messages] == [["abuse@dst.test"]]


async def test_header_checks_redirect_of_a_large_message(tmp_path: Path) -> None:
    """REDIRECT of a message over 128 KiB (past the write buffer): redirected, not held."""
    body = b"".join(b"line %06d " % i + b"x" * 60 + b"\r\n" for i in range(5000))  # ~360 KiB
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, _relay(sink, _checks(tmp_path, "REDIRECT abuse@dst.test")))
        async with running_daemon(conf) as d:
            code, text = await _send(d.port, "a@src.test", ["r1@dst.test", "r2@dst.test"],
                                     SPAM + body)
            assert code == 250, text
            await wait_for_messages(sink, 1)
            await d.wait_idle()
            assert d.queue_ids("hold") == []
    [msg] = sink.messages
    assert msg.rcpt_tos == ["abuse@dst.test"]
    assert len(body) > 128 * 1024 and msg.content.endswith(body)


async def test_smtp_generic_maps_rewrites_only_on_the_way_out(tmp_path: Path) -> None:
    """root@host.localdomain leaves as admin@example.com; the queue file keeps the original."""
    table = tmp_path / "generic"
    table.write_text("root@host.localdomain admin@example.com\n")
    content = b"From: root@host.localdomain\r\nSubject: g\r\n\r\nbody\r\n"
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, _relay(sink, f"smtp_generic_maps = texthash:{table}\n"))
        async with running_daemon(conf, listen=True) as d:
            with watch_logs() as logs:
                code, text = await _send(d.port, "root@host.localdomain", ["r@dst.test"], content)
                assert code == 250, text
                await wait_for_messages(sink, 1)
    [msg] = sink.messages
    assert msg.mail_from == "admin@example.com"
    assert b"From: admin@example.com" in _headers(msg.content)
    queued = [e for e in logs if e.get("component") == "smtpd" and e.get("event") == "queued"]
    assert [e["from_"] for e in queued] == ["<root@host.localdomain>"]


async def test_route_back_to_itself_bounces_after_hopcount_limit(tmp_path: Path) -> None:
    """A transport route to our own listener: 50 relays, then 554 5.4.0 and one DSN."""
    async with smtp_sink() as sink:
        transport = tmp_path / "transport"
        transport.write_text(f"src.test smtp:{sink.nexthop}\n")
        # the loop service says another name, as a gateway would, so only hops stop it
        master = (
            "loop unix - - n - - smtp -o myhostname=gateway.test -o smtp_helo_name=gateway.test\n"
        )
        conf = write_config(tmp_path, f"transport_maps = texthash:{transport}\n", master=master)
        async with running_daemon(conf) as d:
            routes = f"src.test smtp:{sink.nexthop}\ndst.test loop:[127.0.0.1]:{d.port}\n"
            transport.write_text(routes)
            assert d.parts.reload()
            with watch_logs() as logs:
                code, _ = await _send(d.port, "s@src.test", ["r@dst.test"], LOOP)
                assert code == 250
                await wait_for_messages(sink, 1, timeout=120)
                await d.wait_idle(120)
    queued = [
        e
        for e in logs
        if e.get("component") == "smtpd"
        and e.get("event") == "queued"
        and e.get("from_") == "<s@src.test>"
    ]
    assert len(queued) == 50  # 0..49 Received: headers accepted; the 51st try is refused
    [dsn] = sink.messages
    assert dsn.mail_from in ("", "<>") and dsn.rcpt_tos == ["s@src.test"]
    assert b"5.4.0" in dsn.content


async def test_session_log_lines_count_commands(tmp_path: Path) -> None:
    """connect from / disconnect from with Postfix's per-command counts."""
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, _relay(sink))
        async with running_daemon(conf) as d:
            with watch_logs() as logs:
                async with aiosmtplib.SMTP(
                    hostname="127.0.0.1", port=d.port, timeout=TIMEOUT, start_tls=False
                ) as client:
                    await client.ehlo()
                    await client.mail("a@src.test")
                    with pytest.raises(aiosmtplib.SMTPRecipientRefused):
                        await client.rcpt("user@[bad")
                    await client.rcpt("r@dst.test")
                    await client.data(b"Subject: s\r\n\r\nx\r\n")
                await logs.wait_event("disconnect")
    [connect] = [e for e in logs if e["event"] == "connect"]
    [disconnect] = [e for e in logs if e["event"] == "disconnect"]
    assert connect["client"] == disconnect["client"] == "unknown[127.0.0.1]"
    assert disconnect["commands"] == {
        "ehlo": (1, 1),
        "mail": (1, 1),
        "rcpt": (1, 2),
        "data": (1, 1),
        "quit": (1, 1),
    }


async def test_lost_connection_in_data_logs_bytes(tmp_path: Path) -> None:
    """A client gone during DATA: lost connection after DATA (N bytes), then disconnect."""
    conf = write_config(tmp_path)
    async with running_daemon(conf) as d:
        with watch_logs() as logs:
            reader, writer = await asyncio.open_connection("127.0.0.1", d.port)
            await reader.readline()
            writer.write(b"HELO c\r\nMAIL FROM:<a@src.test>\r\nRCPT TO:<r@dst.test>\r\nDATA\r\n")
            for _ in range(4):
                await asyncio.wait_for(reader.readline(), TIMEOUT)
            writer.write(b"Subject: s\r\n\r\n0123456789\r\n")
            await writer.drain()
            await asyncio.sleep(0)
            writer.close()
            await logs.wait_event("disconnect")
        assert d.queue_ids("incoming") == []
    [lost] = [e for e in logs if e["event"] == "lost connection"]
    assert lost["after"] == "DATA" and lost["client"] == "unknown[127.0.0.1]"
    assert 0 < lost["bytes"] <= 28
    [disconnect] = [e for e in logs if e["event"] == "disconnect"]
    assert disconnect["commands"]["data"] == (0, 1)


async def test_sendmail_t_i_with_the_real_daemon_reaches_the_sink(tmp_path: Path) -> None:
    """sendmail -t -i into maildrop/; the daemon process's pickup delivers it to the sink."""
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, _relay(sink, "myorigin = origin.test\n"))
        daemon = DaemonProcess(conf)
        try:
            daemon.start()
            await asyncio.to_thread(daemon.wait_ready)
            env = {**os.environ, "MAIL_CONFIG": str(conf), "PYTHONPATH": str(REPO)}
            proc = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "qmgrd.sendmail", "-t", "-i"],
                input=b"To: r@dst.test\nSubject: from cron\n\n.\nbody\n",
                capture_output=True,
                env=env,
                cwd=REPO,
                timeout=TIMEOUT,
                check=False,
            )
            assert proc.returncode == 0, proc.stderr
            await wait_for_messages(sink, 1)
        finally:
            await asyncio.to_thread(daemon.close)
    [msg] = sink.messages
    assert msg.rcpt_tos == ["r@dst.test"] and msg.mail_from.endswith("@origin.test")
    assert b"\r\n.\r\nbody\r\n" in msg.content.replace(b"\r\n..", b"\r\n.")
    assert list((tmp_path / "spool" / "maildrop").glob("[!.]*")) == []
    assert Spool(tmp_path / "spool").list_ids("incoming") == []
