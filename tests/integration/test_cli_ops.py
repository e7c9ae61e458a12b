"""The operator CLI end to end against a running daemon (engine, agents, control socket, sinks).

Each test runs a whole in-process daemon (``e2e.running_daemon``) with the
control server bound to its engine, relaying to aiosmtpd sinks on 127.0.0.1,
and runs ``qmgrd.cli.main`` in a worker thread, as the shell would, with its
output captured. Daemon logs go to ``capture_logs`` so they never mix with
the command output.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from unittest import mock

import pytest
from structlog.testing import capture_logs

from qmgrd.cli import main
from qmgrd.spool.mailq import HEADER
from qmgrd.spool.queueid import sort_queue_ids
from tests.integration.e2e import InProcessDaemon, message_bytes, running_daemon
from tests.integration.sinks import SinkConfig, SinkServer, smtp_sink
from tests.support.config import write_config

TIMEOUT = 30.0
LIVE_QUEUES = ("incoming", "active", "deferred", "hold")


async def cli(conf: Path, *args: str, stdin: str = "") -> tuple[int, str, str]:
    """Run ``qmgrd -c conf ARGS`` in a worker thread; (exit code, stdout, stderr)."""

    def run() -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            mock.patch("sys.stdin", io.StringIO(stdin)),
        ):
            code = main(["-c", str(conf), *args])
        return code, out.getvalue(), err.getvalue()

    return await asyncio.wait_for(asyncio.to_thread(run), TIMEOUT)


@contextlib.asynccontextmanager
async def daemon(tmp_path: Path, main_cf: str) -> AsyncIterator[tuple[InProcessDaemon, Path]]:
    """An in-process daemon for ``main_cf`` (it serves its control socket)."""
    conf = write_config(tmp_path, main=main_cf)
    async with running_daemon(conf) as d:
        yield d, conf


def busy(d: InProcessDaemon, nexthop: str) -> int:
    """Deliveries in flight to ``nexthop`` according to the engine's status."""
    return sum(
        q["busy"]
        for t in d.engine.status()["transports"]
        for q in t["queues"]
        if q["nexthop"] == nexthop
    )


def received(*sinks: SinkServer) -> Counter[str]:
    """How often each recipient arrived at the sinks."""
    return Counter(rcpt for sink in sinks for m in sink.messages for rcpt in m.rcpt_tos)


def assert_spool_empty(d: InProcessDaemon) -> None:
    for queue in LIVE_QUEUES:
        assert d.queue_ids(queue) == [], queue
    for logs in ("defer", "bounce"):
        assert list((d.spool.root / logs).iterdir()) == [], logs


async def test_mailq_qshape_status_flush_with_a_deferred_message(tmp_path: Path) -> None:
    """A deferred recipient shows in mailq (text and JSON), qshape and status; flush -i delivers."""
    sink_cfg = SinkConfig(rcpt_replies={"bad@dst.test": (450, "4.2.0 mailbox busy")})
    content = message_bytes(size=2000)
    with capture_logs():
        async with smtp_sink(sink_cfg) as sink, daemon(
            tmp_path, f"relayhost = {sink.nexthop}"
        ) as (d, conf):
            before = time.time()
            qid = await d.submit("s@src.test", ["good@dst.test", "bad@dst.test"], content)
            await d.wait_idle()
            assert d.queue_ids("deferred") == [qid]
            assert received(sink) == Counter({"good@dst.test": 1})

            code, out, err = await cli(conf, "mailq", "--json")
            assert (code, err) == (0, "")
            obj = json.loads(out)
            assert out.count("\n") == 1
            assert list(obj) == [
                "queue_name", "queue_id", "arrival_time", "message_size", "forced_expire",
                "sender", "recipients",
            ]
            assert obj["forced_expire"] is False
            assert obj["queue_name"] == "deferred"
            assert obj["queue_id"] == qid
            assert int(before) - 1 <= obj["arrival_time"] <= time.time()
            assert obj["message_size"] == d.spool.open("deferred", qid).content_size
            assert obj["message_size"] >= len(content)
            assert obj["sender"] == "s@src.test"
            [rcpt] = obj["recipients"]
            assert rcpt["address"] == "bad@dst.test"
            assert "450 4.2.0 mailbox busy" in rcpt["delay_reason"]

            code, out, err = await cli(conf, "mailq")
            assert (code, err) == (0, "")
            lines = out.splitlines()
            assert lines[0] == HEADER
            assert lines[1].startswith(f"{qid}  ")
            assert lines[1].split()[1] == str(obj["message_size"])
            assert lines[1].endswith("  s@src.test")
            reason = f"({rcpt['delay_reason']})"
            assert lines[2] == f"{reason:>78}"  # right-aligned to column 78, as Postfix
            assert lines[3] == " " * 41 + "bad@dst.test"
            kbytes = obj["message_size"] // 1024
            assert lines[4:] == ["", f"-- {kbytes} Kbytes in 1 Request."]

            code, out, err = await cli(conf, "qshape", "deferred")
            assert (code, err) == (0, "")
            assert out.splitlines() == [
                "         T 5 10 20 40 80 160 320 640 1280 1280+",
                "   TOTAL 1 1  0  0  0  0   0   0   0    0     0",
                "dst.test 1 1  0  0  0  0   0   0   0    0     0",
            ]
            code, out, _ = await cli(conf, "qshape", "deferred", "--by", "sender")
            assert out.splitlines()[2].split() == ["src.test", "1", "1"] + ["0"] * 9
            code, out, _ = await cli(conf, "qshape")  # incoming + active: nothing there
            assert out.splitlines()[1].split() == ["TOTAL"] + ["0"] * 11

            code, out, err = await cli(conf, "status")
            assert (code, err) == (0, "")
            lines = out.splitlines()
            assert lines[0].startswith("qmgrd: pid ")
            assert "queue files: incoming 0, active 0, deferred 1, hold 0, corrupt 0" in lines
            assert "in core: 0 messages, 0 recipients; 0 waiting to be loaded" in lines
            code, out, err = await cli(conf, "status", "--json")
            status = json.loads(out)
            assert status["queue_files"]["deferred"] == 1
            assert status["stats"]["recipients_sent"] == 1
            assert status["stats"]["recipients_deferred"] == 1

            sink_cfg.rcpt_replies.clear()
            code, out, err = await cli(conf, "flush", "-i", "ZZZZZZZZZZZZZZZ")
            assert (code, out) == (1, "")
            assert err == "qmgrd: warning: ZZZZZZZZZZZZZZZ: no such message in the deferred queue\n"
            assert await cli(conf, "flush", "-i", qid) == (0, "", "")
            await d.wait_idle()
            assert received(sink) == Counter({"good@dst.test": 1, "bad@dst.test": 1})
            assert_spool_empty(d)
            code, out, _ = await cli(conf, "mailq")
            assert out == "Mail queue is empty\n"


async def test_flush_destination_and_flush_all(tmp_path: Path) -> None:
    """flush -s retries the deferred mail of one domain, flush retries all of it."""
    sink_cfg = SinkConfig(rcpt_replies={
        "r@one.test": (450, "4.2.0 later"), "r@two.test": (450, "4.2.0 later"),
    })
    with capture_logs():
        async with smtp_sink(sink_cfg) as sink, daemon(
            tmp_path, f"relayhost = {sink.nexthop}"
        ) as (d, conf):
            first = await d.submit("s@src.test", ["r@one.test"])
            second = await d.submit("s@src.test", ["r@two.test"])
            await d.wait_idle()
            assert d.queue_ids("deferred") == sorted([first, second])
            sink_cfg.rcpt_replies.clear()
            assert await cli(conf, "flush", "-s", "one.test") == (
                0, "qmgrd: one.test: retrying 1 deferred message\n", ""
            )
            await d.wait_idle()
            assert d.queue_ids("deferred") == [second]
            assert await cli(conf, "flush", "-s", "nowhere.test") == (
                0, "qmgrd: nowhere.test: retrying 0 deferred messages\n", ""
            )
            assert await cli(conf, "flush") == (0, "", "")
            await d.wait_idle()
            assert received(sink) == Counter({"r@one.test": 1, "r@two.test": 1})
            assert_spool_empty(d)


async def test_hold_release_delete_requeue_of_waiting_messages(tmp_path: Path) -> None:
    """Through the daemon, waiting (deferred) messages are held, released, deleted, requeued."""
    sink_cfg = SinkConfig(rcpt_replies={f"r{i}@dst.test": (450, "4.2.0 later") for i in range(3)})
    with capture_logs():
        async with smtp_sink(sink_cfg) as sink, daemon(
            tmp_path, f"relayhost = {sink.nexthop}"
        ) as (d, conf):
            ids = [await d.submit("s@src.test", [f"r{i}@dst.test"]) for i in range(3)]
            await d.wait_idle()
            assert d.queue_ids("deferred") == sort_queue_ids(ids)

            assert await cli(conf, "hold", "ALL") == (
                0, "qmgrd: Placed on hold: 3 messages\n", ""
            )
            assert d.queue_ids("hold") == sort_queue_ids(ids)
            code, out, _ = await cli(conf, "mailq")
            heads = [line.split()[0] for line in out.splitlines() if line[:1].strip()]
            assert sum(1 for head in heads if head.endswith("!")) == 3

            assert await cli(conf, "delete", ids[0]) == (0, "qmgrd: Deleted: 1 message\n", "")
            assert not (d.spool.root / "defer" / ids[0]).exists()
            sink_cfg.rcpt_replies.clear()
            code, out, err = await cli(conf, "release", ids[0], ids[1])
            assert (code, out) == (1, "qmgrd: Released from hold: 1 message\n")
            assert err == f"qmgrd: warning: {ids[0]}: no such message\n"
            await d.wait_idle()
            assert received(sink) == Counter({"r1@dst.test": 1})
            assert d.queue_ids("hold") == [ids[2]]
            assert await cli(conf, "requeue", "-", stdin=f"{ids[2]}!\n") == (
                0, "qmgrd: Requeued: 1 message\n", ""
            )
            await d.wait_idle()
            assert received(sink) == Counter({"r1@dst.test": 1, "r2@dst.test": 1})
            assert_spool_empty(d)


async def test_operations_racing_active_delivery(tmp_path: Path) -> None:
    """hold, delete and requeue of messages mid-delivery lose nothing and deliver nothing twice.

    Three 4-recipient messages go to three destinations (window 1, two
    recipients per delivery), so each has a delivery of 2 recipients stalled
    at MAIL and 2 recipients waiting when the operations arrive. The stalled deliveries
    complete; then the held message keeps its 2 undelivered recipients (and
    delivers them once released), the deleted one loses them, and the
    requeued one delivers them after it is loaded again.
    """
    doms = ("held", "gone", "again")
    async with contextlib.AsyncExitStack() as stack:
        sinks = {
            dom: await stack.enter_async_context(smtp_sink(SinkConfig(stall=frozenset({"MAIL"}))))
            for dom in doms
        }
        routes = ", ".join(f"{dom}.test=smtp:{sinks[dom].nexthop}" for dom in doms)
        main_cf = (
            f"transport_maps = inline:{{ {routes} }}\n"
            "default_destination_recipient_limit = 2\n"
            "initial_destination_concurrency = 1\n"
            "default_destination_concurrency_limit = 1\n"
        )
        with capture_logs():
            async with daemon(tmp_path, main_cf) as (d, conf):
                ids = {
                    dom: await d.submit("s@src.test", [f"r{i}@{dom}.test" for i in range(4)])
                    for dom in doms
                }
                for sink in sinks.values():
                    await sink.wait_stalled("MAIL")
                assert all(busy(d, sinks[dom].nexthop) == 1 for dom in doms)
                assert received(*sinks.values()) == Counter()

                assert await cli(conf, "hold", ids["held"]) == (
                    0, "qmgrd: Placed on hold: 1 message (1 when its delivery ends)\n", ""
                )
                assert await cli(conf, "delete", ids["gone"]) == (
                    0, "qmgrd: Deleted: 1 message (1 when its delivery ends)\n", ""
                )
                assert await cli(conf, "requeue", ids["again"]) == (
                    0, "qmgrd: Requeued: 1 message (1 when its delivery ends)\n", ""
                )
                code, out, err = await cli(conf, "release", ids["held"])  # not on hold yet
                assert (code, out) == (1, "qmgrd: Released from hold: 0 messages\n")
                assert err == f"qmgrd: warning: {ids['held']}: no such message\n"

                for sink in sinks.values():
                    sink.release()
                await d.wait_idle()
                got = received(*sinks.values())
                assert max(got.values()) == 1
                assert sum(1 for r in got if r.endswith("@gone.test")) == 2
                assert sum(1 for r in got if r.endswith("@held.test")) == 2
                assert {r for r in got if r.endswith("@again.test")} == {
                    f"r{i}@again.test" for i in range(4)
                }
                assert d.queue_ids("hold") == [ids["held"]]
                remaining = d.spool.open("hold", ids["held"]).read_all_recipients()
                assert {r.address for r in remaining} | {
                    r for r in got if r.endswith("@held.test")
                } == {f"r{i}@held.test" for i in range(4)}
                assert len(remaining) == 2

                assert await cli(conf, "release", ids["held"]) == (
                    0, "qmgrd: Released from hold: 1 message\n", ""
                )
                await d.wait_idle()
                got = received(*sinks.values())
                assert max(got.values()) == 1
                assert {r for r in got if r.endswith("@held.test")} == {
                    f"r{i}@held.test" for i in range(4)
                }
                assert len(got) == 10
                assert_spool_empty(d)


async def test_commands_without_a_daemon(tmp_path: Path) -> None:
    """flush/status/scan need the daemon (exit 1, one line); postsuper ops work on the spool."""
    conf = write_config(tmp_path)
    sock = tmp_path / "spool" / "public" / "qmgrd.sock"
    for args in (["flush"], ["flush", "-s", "x.test"], ["status"], ["scan"]):
        code, out, err = await cli(conf, *args)
        assert (code, out) == (1, "")
        assert err == f"qmgrd: fatal: the daemon is not running (no control socket at {sock})\n"
    from tests.integration.e2e import commit, offline_spool

    spool = offline_spool(conf)
    qid = commit(spool, "s@src.test", ["r@dst.test"], arrival_time=time.time())
    assert await cli(conf, "hold", qid) == (0, "qmgrd: Placed on hold: 1 message\n", "")
    assert spool.list_ids("hold") == [qid]
    assert await cli(conf, "delete", "ALL") == (0, "qmgrd: Deleted: 1 message\n", "")
    assert spool.list_ids("hold") == []


@pytest.mark.parametrize(
    "command",
    ["mailq", "qshape", "flush", "scan", "status", "hold", "release", "delete", "requeue"],
)
async def test_help(tmp_path: Path, command: str) -> None:
    """Every operator command has --help (exit 0, a usage line)."""
    code, out, _ = await cli(tmp_path, command, "--help")
    assert code == 0
    assert out.startswith(f"usage: qmgrd {command}")


@pytest.mark.parametrize(
    "args",
    [
        ["flush", "-s", "a.test", "-i", "AAAAAAAAAAAAAAA"],
        ["hold"],
        ["delete", "not/an/id"],
        ["release", "ALL", "AAAAAAAAAAAAAAA"],
        ["qshape", "maildrop"],
        ["qshape", "-b", "1"],
    ],
)
async def test_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    """Bad arguments are usage errors: exit 2 and a message on stderr."""
    conf = write_config(tmp_path)
    code, out, err = await cli(conf, *args)
    assert code == 2
    assert out == ""
    assert err.strip()
