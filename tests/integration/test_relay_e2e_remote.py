"""Remote behaviour end to end: MX fallback and DNS outcomes, STARTTLS levels, stop and restart.

The daemon runs in process (``e2e.running_daemon``) with the real SMTP agent,
a DNS responder on 127.0.0.1 (``smtp_dns_nameservers``) and aiosmtpd sinks on
loopback addresses; routes come from ``transport_maps = inline:{...}``.
"""

from __future__ import annotations

import email
import ssl
import time
from collections import Counter
from pathlib import Path

from structlog.testing import capture_logs

from qmgrd.spool import QueueFile, Spool
from tests.integration.dnsserver import dns_responder
from tests.integration.e2e import (
    commit,
    message_bytes,
    offline_spool,
    running_daemon,
    sent_events,
    status_events,
    wait_for_messages,
)
from tests.integration.sinks import SinkConfig, SinkServer, smtp_sink
from tests.support.config import write_config


def _routes(pairs: dict[str, str]) -> str:
    body = ", ".join(f"{key}={value}" for key, value in pairs.items())
    return f"transport_maps = inline:{{ {body} }}"


def _received(*sinks: SinkServer) -> Counter[str]:
    return Counter(rcpt for sink in sinks for m in sink.messages for rcpt in m.rcpt_tos)


async def test_mx_fallback_null_mx_and_servfail_in_one_message(tmp_path: Path) -> None:
    """Best MX refuses, the next accepts; null MX bounces to the sender; SERVFAIL defers."""
    async with smtp_sink(host="127.0.0.3") as mx2, smtp_sink() as home:
        port = mx2.port  # nothing listens on 127.0.0.2 at this port: mx1 refuses
        records = {
            ("example.test", "MX"): ["10 mx1.example.test.", "20 mx2.example.test."],
            ("mx1.example.test", "A"): ["127.0.0.2"],
            ("mx2.example.test", "A"): ["127.0.0.3"],
            ("null.test", "MX"): ["0 ."],
        }
        async with dns_responder(records, failures={"servfail.test": "SERVFAIL"}) as dns:
            routes = {
                "example.test": f"smtp:example.test:{port}",
                "null.test": f"smtp:null.test:{port}",
                "servfail.test": f"smtp:servfail.test:{port}",
                "src.test": f"smtp:{home.nexthop}",
            }
            conf = write_config(
                tmp_path,
                main=f"{_routes(routes)}\nsmtp_dns_nameservers = {dns.nameserver}\n",
            )
            with capture_logs() as logs:
                async with running_daemon(conf) as d:
                    qid = await d.submit(
                        "sender@src.test", ["a@example.test", "b@null.test", "c@servfail.test"]
                    )
                    await d.wait_idle()
                    assert d.queue_ids("deferred") == [qid]
                    (reason,) = d.spool.read_reasons("defer", qid)
                    assert reason.address == "c@servfail.test" and reason.dsn.startswith("4.")
            assert ("mx1.example.test", "A") in dns.queries
    assert _received(mx2) == Counter(["a@example.test"])
    assert [a for q, a in sent_events(logs) if q == qid] == ["a@example.test"]
    (sent,) = [e for e in status_events(logs, "sent") if e["queue_id"] == qid]
    assert str(sent["relay"]).startswith("mx2.example.test[127.0.0.3]")
    (bounced,) = status_events(logs, "bounced")
    assert bounced["to"] == "<b@null.test>" and str(bounced["dsn"]).startswith("5.")
    # The null-MX bounce went back to the sender as a DSN.
    (dsn,) = home.messages
    assert dsn.rcpt_tos == ["sender@src.test"]
    parsed = email.message_from_bytes(dsn.content)
    assert parsed.get_content_type() == "multipart/report"
    assert b"b@null.test" in dsn.content and b"c@servfail.test" not in dsn.content


async def test_starttls_may_and_encrypt_and_encrypt_without_starttls_defers(
    tmp_path: Path, server_tls: ssl.SSLContext
) -> None:
    """Level may uses TLS when offered, else plaintext; encrypt without STARTTLS defers."""
    async with smtp_sink(SinkConfig(tls_context=server_tls)) as tls, smtp_sink() as plain:
        routes = {
            "may-tls.test": f"smtp:{tls.nexthop}",
            "may-plain.test": f"smtp:{plain.nexthop}",
            "enc-tls.test": f"secure:{tls.nexthop}",
            "enc-plain.test": f"secure:{plain.nexthop}",
        }
        conf = write_config(
            tmp_path,
            main=f"{_routes(routes)}\nsmtp_tls_security_level = may\n",
            master="secure unix - - n - - smtp -o smtp_tls_security_level=encrypt\n",
        )
        with capture_logs() as logs:
            async with running_daemon(conf) as d:
                ok = [
                    await d.submit("s@src.test", [rcpt])
                    for rcpt in ("x@may-tls.test", "x@may-plain.test", "x@enc-tls.test")
                ]
                refused = await d.submit("s@src.test", ["x@enc-plain.test"])
                await d.wait_idle()
                assert d.queue_ids("deferred") == [refused]
                (reason,) = d.spool.read_reasons("defer", refused)
                assert reason.dsn.startswith("4.") and "TLS" in reason.reason
    assert {m.rcpt_tos[0]: m.peer_tls for m in tls.messages} == {
        "x@may-tls.test": True,
        "x@enc-tls.test": True,
    }
    assert [(m.rcpt_tos, m.peer_tls) for m in plain.messages] == [(["x@may-plain.test"], False)]
    assert sorted(q for q, _a in sent_events(logs)) == sorted(ok)


def _pending(spool: Spool) -> Counter[str]:
    """Recipients still ``R`` (not done) in every queue file of the spool."""
    out: Counter[str] = Counter()
    for queue in ("incoming", "active", "deferred"):
        for qid in spool.list_ids(queue):
            qf = QueueFile.open(spool.path(queue, qid))
            offset = qf.first_recipient_offset
            while offset:
                records, offset = qf.read_recipients(offset, 1000)
                out.update(r.address for r in records)
    return out


async def test_stop_mid_load_and_restart_delivers_everything_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    """Stopped after 20 of 80 messages, restarted: every recipient once, no done one again.

    The sink answers slowly (2 ms per command) so the stop lands in the middle
    of the load. At the stop, in-flight deliveries finish (shutdown_timeout)
    and the rest stays in ``active/``; the restart moves it back to
    ``incoming/``. What the second run delivers must be exactly the recipients
    still ``R`` in the queue files at the stop.
    """
    rcpts = {i: [f"m{i}r{j}@dst.test" for j in range(1 + i % 4)] for i in range(80)}
    expected = Counter(r for rs in rcpts.values() for r in rs)
    async with smtp_sink(SinkConfig(delay=0.002)) as sink:
        conf = write_config(
            tmp_path,
            main=f"relayhost = {sink.nexthop}\nsmtp_destination_concurrency_limit = 4\n",
        )
        spool = offline_spool(conf)
        for i, rs in rcpts.items():
            commit(spool, "s@src.test", rs, message_bytes(f"m{i}"), arrival_time=time.time())
        async with running_daemon(conf, listen=False) as d:
            await wait_for_messages(sink, 20)
        first_run = _received(sink)
        pending = _pending(spool)
        assert spool.list_ids("active"), "the stop should leave messages in active/"
        assert first_run + pending == expected  # nothing lost, nothing marked done twice
        assert not set(first_run) & set(pending)  # delivered ones are all marked done
        done_at_stop = len(sink.messages)
        with capture_logs() as logs:
            async with running_daemon(conf, listen=False) as d:
                await d.wait_idle()
                for queue in ("incoming", "active", "deferred"):
                    assert d.queue_ids(queue) == [], queue
    second_run = Counter(r for m in sink.messages[done_at_stop:] for r in m.rcpt_tos)
    assert second_run == pending
    assert _received(sink) == expected
    assert any(e.get("event") == "recovered messages from the active queue" for e in logs)
