"""Delivery worker processes (``delivery_worker_processes``): ``qmgrd run`` as a subprocess.

The listener runs in the queue manager (``smtpd_worker_processes = 1``), so the
daemon's children are its delivery workers (``qmgrd-delivery``). Mail goes
to in-process sinks (``tests/integration/sinks.py``) over real SMTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

import aiosmtplib

from tests.integration.e2e import offline_spool
from tests.integration.sinks import SinkConfig, SinkServer, smtp_sink
from tests.integration.test_workers import Relay, _ids, _relay
from tests.support.process import DaemonProcess
from tests.support.waits import wait_until

TIMEOUT = 30.0
RETRY = (  # a delivery deferred by a dead worker is tried again within a second or two
    "minimal_backoff_time = 1s\nmaximal_backoff_time = 2s\nqueue_run_delay = 1s\n"
)


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _spool_empty(relay: Relay) -> bool:
    spool = offline_spool(relay.conf)
    return not any(spool.list_ids(q) for q in ("incoming", "active", "deferred"))


async def test_mail_through_two_delivery_workers_arrives_exactly_once(tmp_path: Path) -> None:
    """Two delivery workers and two destinations: every recipient of 20 messages arrives once,
    the outcomes reach /metrics and the queue manager's log, the workers' own log lines carry
    their pids (qmgrd/smtp[PID]), and SIGTERM stops them with the queue manager."""
    routes = "transport_maps = inline:{{ loop.test=loopy:{} }}\n"
    async with (
        smtp_sink() as looping,
        _relay2(tmp_path, routes.format(looping.nexthop), queued=_loopy) as (relay, sink),
    ):
        workers = relay.proc.children()
        assert [_comm(pid) for pid in workers] == ["qmgrd-delivery"] * 2
        for i in range(20):
            await aiosmtplib.send(
                f"Message-ID: <m{i}@test>\r\nSubject: m{i}\r\n\r\nbody\r\n".encode(),
                sender="s@example.com",
                recipients=[f"a{i}@example.org", f"b{i}@example.org", f"c{i}@example.net"],
                hostname="127.0.0.1",
                port=relay.port,
                timeout=TIMEOUT,
            )
        await sink.wait_for(
            lambda: sum(len(m.rcpt_tos) for m in sink.messages) >= 60, "60 recipients", TIMEOUT
        )
        received = sorted(r for m in sink.messages for r in m.rcpt_tos)
        assert received == sorted(
            f"{p}{i}@example.{'net' if p == 'c' else 'org'}" for i in range(20) for p in "abc"
        )
        await aiosmtplib.send(
            b"Subject: loop\r\n\r\nloop\r\n",
            sender="s@example.com",
            recipients=["x@loop.test"],
            hostname="127.0.0.1",
            port=relay.port,
            timeout=TIMEOUT,
        )  # to loop.test: the worker's agent sees its own name
        await wait_until(lambda: "loops back to myself" in relay.log(), "the bounce", TIMEOUT)
        log = relay.log().splitlines()
        warnings = [line for line in log if "greeted me with my own hostname" in line]
        assert warnings  # logged by the worker that delivered, with its pid
        assert all(any(f"qmgrd/smtp[{pid}]: warning:" in w for pid in workers) for w in warnings)
        qmgr = f"qmgrd/smtp[{relay.proc.proc.pid}]:"  # outcomes: the queue manager's lines

        def sent() -> list[str]:  # the 60 and the bounce of the loop to its sender
            return [line for line in relay.log().splitlines() if "status=sent" in line]

        await wait_until(lambda: len(sent()) == 61, "61 sent in the log", TIMEOUT)
        assert all(qmgr in line for line in sent())
        await wait_until(
            lambda: relay.metric('qmgrd_deliveries_total{status="sent",transport="smtp"}') == 61,
            "61 sent in the metrics",
            TIMEOUT,
        )
        await wait_until(lambda: _spool_empty(relay), "the spool to empty", TIMEOUT)
        assert await asyncio.to_thread(relay.proc.stop, signal.SIGTERM, TIMEOUT) == 0
        for pid in workers:
            assert not Path(f"/proc/{pid}").exists()
    assert _ids(sink).count("m0") == 1


def _loopy(conf: Path) -> None:
    """A transport ``loopy`` whose myhostname is the sinks' (they greet with it: a loop)."""
    with (conf / "master.cf").open("a") as f:
        f.write("loopy unix - - n - - smtp -o myhostname=sink.test\n")


def _relay2(
    tmp_path: Path,
    extra: str = "",
    sink_config: SinkConfig | None = None,
    queued: Callable[[Path], None] = lambda _conf: None,
) -> contextlib.AbstractAsyncContextManager[tuple[Relay, SinkServer]]:
    """A relay with two delivery workers (``_relay`` of the listener worker tests)."""
    return _relay(tmp_path, 1, "delivery_worker_processes = 2\n" + extra, sink_config, queued)


def _sockets(pid: int) -> int:
    """How many sockets ``pid`` holds open (its channel and its SMTP sessions)."""
    fds = Path(f"/proc/{pid}/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("socket:")
    return count


async def test_sigkilled_delivery_worker_under_load_loses_nothing(tmp_path: Path) -> None:
    """Clients keep sending while deliveries hang at the sink's end of data; the delivery
    worker holding them is SIGKILLed: its deliveries are deferred (4.3.0, logged), a new
    worker starts, and once the sink answers every accepted recipient arrives at least once
    and the spool empties."""
    async with _relay2(tmp_path, RETRY, SinkConfig(stall=frozenset({"DOT"}))) as (relay, sink):
        first = relay.proc.children()
        acked: list[str] = []
        stop = asyncio.Event()

        async def client(c: int) -> None:
            for i in range(300):  # bounded
                if stop.is_set():
                    return
                tag = f"c{c}n{i}"
                await relay.send(tag)  # the listener is in the queue manager: always queued
                acked.append(tag)

        clients = [asyncio.ensure_future(client(c)) for c in range(3)]
        await sink.wait_stalled("DOT", 3, TIMEOUT)
        victim = max(first, key=_sockets)  # the one with SMTP sessions to the sink
        assert _sockets(victim) > 1
        await relay.kill_worker(victim, "delivery")
        count = len(acked)
        await wait_until(lambda: len(acked) >= count + 10, "10 more messages", TIMEOUT)
        stop.set()
        await asyncio.gather(*clients)
        sink.release()
        await sink.wait_for(
            lambda: set(acked) <= set(_ids(sink)), f"{len(acked)} acked messages", TIMEOUT
        )
        await wait_until(lambda: _spool_empty(relay), "the spool to empty", TIMEOUT)
        log = relay.log()
        assert f"DeliveryWorkerError('delivery process pid {victim} ended')" in log
        assert "dsn=4.3.0, status=deferred (unknown mail transport error)" in log


async def test_sighup_reaches_every_delivery_worker(tmp_path: Path) -> None:
    """SIGHUP: every delivery worker reopens its log (rotation) and applies the new
    configuration (an smtp_header_checks rule) before READY=1."""
    async with _relay2(tmp_path) as (relay, sink):
        workers = relay.proc.children()
        await relay.reload("smtp_header_checks = regexp:{ {/^Subject:/ PREPEND X-R: 1} }")
        for pid in workers:  # in the new file, before READY=1
            assert f"qmgrd/smtp[{pid}]: configuration reloaded" in relay.log()
        await relay.send("after")
        await sink.wait_messages(1, TIMEOUT)
        assert b"\r\nX-R: 1\r\nSubject: after\r\n" in sink.messages[0].content


async def test_sigterm_stops_the_delivery_workers_and_loses_nothing(tmp_path: Path) -> None:
    """SIGTERM with a delivery hanging in a worker: after shutdown_timeout the daemon and its
    workers exit 0, the message stays queued, and the next start delivers it."""
    async with _relay2(
        tmp_path, "shutdown_timeout = 1s\n", SinkConfig(stall=frozenset({"DOT"}))
    ) as (relay, sink):
        workers = relay.proc.children()
        await relay.send("hanging")
        await sink.wait_stalled("DOT", 1, TIMEOUT)
        assert await asyncio.to_thread(relay.proc.stop, signal.SIGTERM, TIMEOUT) == 0
        for pid in workers:
            assert not Path(f"/proc/{pid}").exists()
        assert "did not stop" not in relay.log()
        assert not _spool_empty(relay)
        sink.release()
        relay.proc.close()
        relay.proc = DaemonProcess(relay.conf).start()
        await asyncio.to_thread(relay.proc.wait_ready, TIMEOUT)
        await sink.wait_for(lambda: "hanging" in _ids(sink), "the message", TIMEOUT)
        await wait_until(lambda: _spool_empty(relay), "the spool to empty", TIMEOUT)


async def test_a_delivery_worker_stopped_on_its_own_defers_and_is_restarted(
    tmp_path: Path,
) -> None:
    """SIGTERM to a delivery worker alone (as systemd's control-group stop does): its hanging
    delivery gets shutdown_timeout, is cancelled and deferred; the queue manager restarts the
    worker, and the message is delivered once the sink answers."""
    async with _relay2(
        tmp_path, RETRY + "shutdown_timeout = 1s\n", SinkConfig(stall=frozenset({"DOT"}))
    ) as (relay, sink):
        await relay.send("stopped")
        await sink.wait_stalled("DOT", 1, TIMEOUT)
        victim = max(relay.proc.children(), key=_sockets)
        os.kill(victim, signal.SIGTERM)
        exit_line = f"process qmgrd/delivery pid {victim} exit status 0; restarting it"
        await wait_until(lambda: exit_line in relay.log(), "the worker's exit", TIMEOUT)
        assert f"qmgrd/smtp[{victim}]: warning: deliveries cancelled at shutdown" in relay.log()
        await wait_until(lambda: "status=deferred" in relay.log(), "the deferral", TIMEOUT)
        sink.release()
        await sink.wait_for(lambda: "stopped" in _ids(sink), "the message", TIMEOUT)
        await wait_until(lambda: _spool_empty(relay), "the spool to empty", TIMEOUT)
        assert len(relay.proc.children()) == 2 and victim not in relay.proc.children()
