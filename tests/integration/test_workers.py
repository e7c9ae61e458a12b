"""Listener worker processes (``smtpd_worker_processes``): ``qmgrd run`` as a subprocess.

Which worker serves a connection is the kernel's choice (they share the
listening socket), so the tests that need a given worker stop the others
with SIGSTOP: a stopped process cannot accept, the running one takes every
connection. Each worker logs to ``maillog_file`` with its own pid
(``qmgrd/smtpd[PID]``), which tells who accepted what.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiosmtplib
import pytest

from qmgrd.daemon.admitting import REFUSE_REPLY
from qmgrd.spool import QueueIdGenerator, Spool
from qmgrd.spool.records import Envelope, RecipientSpec
from tests.integration.e2e import commit, offline_spool
from tests.integration.sinks import SinkConfig, SinkServer, smtp_sink
from tests.support.config import free_port, write_config
from tests.support.onemessage import one_message
from tests.support.process import DaemonProcess
from tests.support.waits import wait_until

TIMEOUT = 30.0


def _message(tag: str) -> bytes:
    return f"Message-ID: <{tag}@test>\r\nSubject: {tag}\r\n\r\nbody {tag}\r\n".encode()


def _ids(sink: SinkServer) -> list[str]:
    out = []
    for m in sink.messages:
        for line in m.content.split(b"\r\n"):
            if line.lower().startswith(b"message-id:"):
                out.append(line.split(b"<", 1)[1].split(b"@", 1)[0].decode())
    return out


class Relay:
    """A ``qmgrd run`` with workers relaying to an in-process sink."""

    def __init__(self, root: Path, sink: SinkServer, workers: int, extra: str = "") -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.maillog = root / "maillog"
        self.root = root
        self.conf = write_config(
            root,
            f"relayhost = {sink.nexthop}\n"
            f"smtpd_worker_processes = {workers}\n"
            f"maillog_file = {self.maillog}\n"
            f"metrics_listen = 127.0.0.1:{self.metrics_port}\n"
            "smtpd_banner = $myhostname ESMTP first\n" + extra,
            listen=f"127.0.0.1:{self.port}",
        )
        self.proc = DaemonProcess(self.conf)

    def log(self) -> str:
        return self.maillog.read_text() if self.maillog.exists() else ""

    async def kill_worker(self, victim: int, program: str) -> None:
        """SIGKILL the worker ``victim``; return once its death (``qmgrd/PROGRAM``) is logged
        and a new worker took its place."""
        workers = len(self.proc.children())
        os.kill(victim, signal.SIGKILL)
        death = f"process qmgrd/{program} pid {victim} killed by signal 9; restarting it"
        await wait_until(lambda: death in self.log(), "the death in the log", TIMEOUT)
        await wait_until(
            lambda: len(self.proc.children()) == workers and victim not in self.proc.children(),
            "a new worker",
            TIMEOUT,
        )

    async def reload(self, line: str) -> None:
        """Append ``line`` to main.cf, rotate maillog_file, SIGHUP, wait for READY=1."""
        main_cf = self.conf / "main.cf"
        main_cf.write_text(main_cf.read_text() + line + "\n")
        self.maillog.rename(self.maillog.with_name("maillog.1"))
        self.proc.send_signal(signal.SIGHUP)
        await asyncio.to_thread(self.proc.wait_notify, "READY=1", TIMEOUT)

    async def send(self, tag: str) -> None:
        """One message in a session of its own (raises unless it was queued)."""
        await aiosmtplib.send(
            _message(tag),
            sender="s@example.com",
            recipients=[f"{tag}@example.org"],
            hostname="127.0.0.1",
            port=self.port,
            timeout=TIMEOUT,
        )

    def metric(self, name: str) -> float:
        """One sample of the daemon's /metrics (0 when absent)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    async def banner(self) -> str:
        """The greeting of a new session."""
        client = aiosmtplib.SMTP(hostname="127.0.0.1", port=self.port, timeout=TIMEOUT)
        greeting = await client.connect()
        await client.quit()
        return greeting.message


@contextlib.contextmanager
def _stopped(pids: list[int]) -> Iterator[None]:
    """SIGSTOP ``pids`` for the block (they cannot accept), SIGCONT after."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


@contextlib.asynccontextmanager
async def _relay(
    tmp_path: Path,
    workers: int,
    extra: str = "",
    sink_config: SinkConfig | None = None,
    queued: Callable[[Path], None] = lambda _conf: None,
) -> AsyncIterator[tuple[Relay, SinkServer]]:
    async with smtp_sink(sink_config) as sink:
        relay = Relay(tmp_path, sink, workers, extra)
        queued(relay.conf)
        try:
            relay.proc.start()
            await asyncio.to_thread(relay.proc.wait_ready, TIMEOUT)
            yield relay, sink
        finally:
            await asyncio.to_thread(relay.proc.close)


async def test_mail_accepted_by_each_worker_is_delivered_exactly_once(tmp_path: Path) -> None:
    """Two workers; each in turn takes every connection while the other is stopped: all
    messages are delivered once, each worker logged its sessions under its own pid, and
    SIGTERM stops the workers and then the queue manager (exit 0, no process left)."""
    async with _relay(tmp_path, 2) as (relay, sink):
        workers = relay.proc.children()
        assert len(workers) == 2
        for n, pid in enumerate(workers):
            others = [w for w in workers if w != pid]
            with _stopped(others):
                for i in range(5):
                    await relay.send(f"w{n}m{i}")
        await sink.wait_messages(10, TIMEOUT)
        assert sorted(_ids(sink)) == sorted(f"w{n}m{i}" for n in range(2) for i in range(5))
        # the workers' intake counts reach the queue manager's metrics (sent every 50 ms)
        await wait_until(
            lambda: relay.metric("qmgrd_smtpd_messages_total") == 10, "10 in the metrics", TIMEOUT
        )
        assert relay.metric("qmgrd_smtpd_connections_total") == 10
        await wait_until(
            lambda: relay.metric("qmgrd_smtpd_sessions") == 0, "no session left", TIMEOUT
        )
        log = relay.log()
        for pid in workers:
            assert f"qmgrd/smtpd[{pid}]: connect from unknown[127.0.0.1]" in log
        assert f"qmgrd/qmgr[{relay.proc.proc.pid}]" in log
        assert await asyncio.to_thread(relay.proc.stop, signal.SIGTERM, TIMEOUT) == 0
        for pid in workers:
            assert not Path(f"/proc/{pid}").exists()
    assert _ids(sink).count("w0m0") == 1  # nothing delivered twice meanwhile


async def test_one_worker_means_the_listener_runs_in_process(tmp_path: Path) -> None:
    """smtpd_worker_processes = 1: no child process; the queue manager's pid logs smtpd."""
    async with _relay(tmp_path, 1) as (relay, sink):
        assert relay.proc.children() == []
        await relay.send("solo")
        await sink.wait_messages(1, TIMEOUT)
        assert f"qmgrd/smtpd[{relay.proc.proc.pid}]: connect from" in relay.log()


async def test_sigkilled_worker_under_load_loses_nothing_and_is_restarted(
    tmp_path: Path,
) -> None:
    """Clients send without pause; one worker is SIGKILLed mid-stream. Every message that
    got its 250 is delivered exactly once, the death is logged and a new worker starts."""
    async with _relay(tmp_path, 2) as (relay, sink):
        first = relay.proc.children()
        acked: list[str] = []
        failed = 0
        stop = asyncio.Event()

        async def client(c: int) -> None:
            nonlocal failed
            for i in range(400):  # bounded
                if stop.is_set():
                    return
                tag = f"c{c}n{i}"
                try:
                    await relay.send(tag)
                except (aiosmtplib.SMTPException, OSError):
                    failed += 1
                    continue
                acked.append(tag)

        clients = [asyncio.ensure_future(client(c)) for c in range(4)]
        await wait_until(lambda: len(acked) >= 20, "20 messages queued", TIMEOUT)
        await relay.kill_worker(first[0], "smtpd")
        count = len(acked)
        await wait_until(lambda: len(acked) >= count + 20, "20 more messages", TIMEOUT)
        stop.set()
        await asyncio.gather(*clients)
        await sink.wait_for(
            lambda: set(acked) <= set(_ids(sink)), f"{len(acked)} acked messages", TIMEOUT
        )
        delivered = _ids(sink)
        assert not [t for t in acked if delivered.count(t) != 1]
        [new] = [pid for pid in relay.proc.children() if pid not in first]
        with _stopped([pid for pid in relay.proc.children() if pid != new]):
            await relay.send("probe")  # the new worker serves
        assert f"qmgrd/smtpd[{new}]: connect from" in relay.log()
        await sink.wait_for(lambda: "probe" in _ids(sink), "the probe", TIMEOUT)


async def test_a_commit_whose_notice_was_lost_is_found_when_its_worker_dies(
    tmp_path: Path,
) -> None:
    """A file committed to incoming/ with no notice (as when a worker dies between its
    commit and its notice) is delivered once the queue manager hears a worker died; the
    dead worker's unfinished temporaries (ids of its slot) are removed, no one else's."""
    async with _relay(tmp_path, 2) as (relay, sink):
        spool = Spool(tmp_path / "spool", ids=QueueIdGenerator())
        env = Envelope("s@example.com", (RecipientSpec("orphan@example.org"),), 1e9)
        await asyncio.to_thread(spool.commit, env, _message("orphan"))
        temps = [
            spool.root / "incoming" / f".{QueueIdGenerator(slot=k, slots=3).next()}"
            for k in range(3)  # the queue manager's slot, then the two workers'
        ]
        for temp in temps:
            temp.write_bytes(b"half a message")
        assert sink.messages == []
        os.kill(relay.proc.children()[0], signal.SIGKILL)
        await sink.wait_messages(1, TIMEOUT)
        assert _ids(sink) == ["orphan"]
        await wait_until(
            lambda: "removed a dead worker's unfinished queue files: count=1" in relay.log(),
            "the dead worker's temporaries removed",
            TIMEOUT,
        )
        assert temps[0].exists() and [t.exists() for t in temps[1:]].count(True) == 1


async def test_sighup_reaches_every_worker_and_a_refused_reload_stays_refused(
    tmp_path: Path,
) -> None:
    """A new smtpd_banner after SIGHUP is served by every worker, and every worker writes to
    the reopened maillog_file (rotation); a reload the queue manager refuses (a bad
    parameter value) changes no worker."""
    async with _relay(tmp_path, 2) as (relay, _sink):
        workers = relay.proc.children()
        await relay.reload("smtpd_banner = $myhostname ESMTP second")
        for pid in workers:  # READY=1 came after every worker applied the reload
            with _stopped([w for w in workers if w != pid]):
                assert (await relay.banner()).endswith("ESMTP second")
            assert f"qmgrd/smtpd[{pid}]: connect from" in relay.log()  # the new file
        main_cf = relay.conf / "main.cf"
        main_cf.write_text(
            main_cf.read_text()
            + "smtpd_banner = $myhostname ESMTP third\nsmtpd_session_limit = many\n"
        )
        relay.proc.send_signal(signal.SIGHUP)
        await wait_until(lambda: "reload refused" in relay.log(), "a refusal", TIMEOUT)
        await asyncio.to_thread(relay.proc.wait_notify, "READY=1", TIMEOUT)
        for pid in workers:
            with _stopped([w for w in workers if w != pid]):
                assert (await relay.banner()).endswith("ESMTP second")


@pytest.mark.parametrize("value", ["lots", "-1"])
def test_a_bad_worker_count_stops_the_start(tmp_path: Path, value: str) -> None:
    """smtpd_worker_processes must be auto or a number: the start fails with exit 1."""
    conf = write_config(tmp_path, f"smtpd_worker_processes = {value}\n")
    proc = DaemonProcess(conf).start()
    try:
        assert proc.proc.wait(TIMEOUT) == 1
        proc.wait_for("smtpd_worker_processes")
    finally:
        proc.close()


async def test_fair_admission_refuses_a_flow_over_its_backlog_in_every_worker(
    tmp_path: Path,
) -> None:
    """qmgr_flow_backlog_limit with workers: the queue manager sends the flows over their
    backlog to the workers; each refuses MAIL FROM of that flow (452 4.3.2) and accepts
    another sender."""

    def queue_backlog(conf: Path) -> None:  # one to deliver (held by the sink), 3 waiting
        spool = offline_spool(conf)
        for i in range(4):
            commit(spool, "a@a.test", [f"a{i}@dst.test"], arrival_time=1e9)

    async with _relay(
        tmp_path,
        2,
        "default_fairness_key = sender_domain\n"
        "qmgr_message_active_limit = 1\n"
        "qmgr_flow_backlog_limit = 3\n",
        SinkConfig(stall=frozenset({"MAIL"})),
        queue_backlog,
    ) as (relay, sink):
        await sink.wait_stalled("MAIL", 1, TIMEOUT)
        workers = relay.proc.children()
        for pid in workers:
            with _stopped([w for w in workers if w != pid]):
                await _wait_refused(relay)
                async with aiosmtplib.SMTP(
                    hostname="127.0.0.1", port=relay.port, timeout=TIMEOUT
                ) as client:
                    await client.ehlo()
                    assert (await client.execute_command(b"MAIL", b"FROM:<b@b.test>")).code == 250
            assert f"qmgrd/smtpd[{pid}]: connect from" in relay.log()
        sink.release()


async def _wait_refused(relay: Relay) -> None:
    """MAIL FROM of the a.test flow is refused by the running worker once the set of flows
    over their backlog reached it (another process's state: polled, bounded in count)."""
    for _ in range(200):
        async with aiosmtplib.SMTP(
            hostname="127.0.0.1", port=relay.port, timeout=TIMEOUT
        ) as client:
            await client.ehlo()
            reply = await client.execute_command(b"MAIL", b"FROM:<other@A.test>")
        if reply.code == 452:
            assert reply.message == REFUSE_REPLY[4:]
            return
        await asyncio.sleep(0.05)
    raise AssertionError("MAIL FROM of the flow over its backlog was never refused")


async def test_in_flow_delay_paces_mail_in_the_workers_from_the_queue_managers_pipe(
    tmp_path: Path,
) -> None:
    """in_flow_delay with workers: they take their tokens from the pipe the queue manager
    feeds. It holds one token (default_process_limit = 1) and gets none back while the queue
    manager is behind (mail waits to be loaded, none moves out of incoming/): the first MAIL
    takes it (the queue manager's pipe is then empty), the next waits in_flow_delay for one
    that never comes and goes on (Postfix's behaviour), counted as a pause that timed out.
    The relay starts with in_flow_delay = 0 (no pacing, no token taken): the workers apply
    the 1s of a SIGHUP reload."""

    def queue_backlog(conf: Path) -> None:  # one to deliver (held by the sink), 3 waiting
        spool = offline_spool(conf)
        for i in range(4):
            commit(spool, "a@a.test", [f"a{i}@dst.test"], arrival_time=1e9)

    timeouts = 'qmgrd_intake_flow_pauses_total{outcome="timeout"}'
    async with _relay(
        tmp_path,
        2,
        "qmgr_message_active_limit = 1\ndefault_process_limit = 1\nin_flow_delay = 0\n",
        SinkConfig(stall=frozenset({"MAIL"})),
        queue_backlog,
    ) as (relay, sink):
        await sink.wait_stalled("MAIL", 1, TIMEOUT)
        for i in range(3):
            await relay.send(f"unpaced{i}")
        assert relay.metric("qmgrd_intake_flow_tokens") == 1  # in_flow_delay = 0: none taken
        main_cf = relay.conf / "main.cf"
        main_cf.write_text(main_cf.read_text() + "in_flow_delay = 1s\n")
        relay.proc.send_signal(signal.SIGHUP)
        await asyncio.to_thread(relay.proc.wait_notify, "READY=1", TIMEOUT)
        assert relay.metric(timeouts) == 0
        for i in range(3):
            await relay.send(f"paced{i}")
        await wait_until(lambda: relay.metric(timeouts) >= 2, "the workers' pauses to count")
        assert relay.metric("qmgrd_intake_flow_tokens") == 0  # the workers emptied its pipe
        assert "qmgrd/smtpd[" in relay.log()
        sink.release()
        await wait_until(lambda: len(sink.messages) == 10, "every message to be delivered")


async def test_in_flow_backlog_limit_gets_421_from_the_workers_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """in_flow_backlog_limit with workers: past it (deliveries stalled, so accepted mail stays
    with the queue manager) the workers answer 421 4.3.2; every accepted message is delivered
    exactly once once the sink is released, and the spool empties."""
    limit = 3
    async with _relay(
        tmp_path,
        2,
        f"in_flow_backlog_limit = {limit}\n",
        SinkConfig(stall=frozenset({"MAIL"})),
    ) as (relay, sink):
        outcomes = [await one_message(relay.port, 0)]
        assert outcomes[0][0] == "accepted"
        await sink.wait_stalled("MAIL", 1, TIMEOUT)
        for n in range(1, 200):  # bounded: until the flag reached a worker, and a few more
            outcomes.append(await one_message(relay.port, n))
            refused = [v for kind, v in outcomes if kind == "refused"]
            if len(refused) >= 4:
                break
            if outcomes[-1][0] == "accepted":
                await asyncio.sleep(0.05)  # let the commit reach the queue manager's count
        accepted = [v for kind, v in outcomes if kind == "accepted"]
        assert len(refused) >= 4, outcomes
        assert all(r == "421 4.3.2 Service currently unavailable" for r in refused)
        assert len(accepted) >= limit  # capacity was used before refusing
        await wait_until(
            lambda: relay.metric("qmgrd_intake_overload_refusals_total") >= len(refused),
            "the workers' refusals to count",
        )
        sink.release()
        await wait_until(lambda: len(sink.messages) == len(accepted), "the accepted mail")
        spool = offline_spool(relay.conf)
        await wait_until(
            lambda: not any(spool.list_ids(q) for q in ("incoming", "active", "deferred")),
            "the spool to empty",
        )
    subjects = sorted(m.content.split(b"Subject: ")[1].split(b"\r\n")[0] for m in sink.messages)
    assert len(subjects) == len(set(subjects)) == len(accepted)  # each exactly once
