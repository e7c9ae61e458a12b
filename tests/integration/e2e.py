"""An in-process qmgrd for end-to-end tests: listener, engine and real agents on the test's loop.

Usage::

    conf = write_config(tmp_path, main="relayhost = [127.0.0.1]:2525")
    async with running_daemon(conf) as d:
        qid = await d.submit("s@src.test", ["r@dst.test"])    # over SMTP to the listener
        qid = d.enqueue("s@src.test", ["r@dst.test"])         # straight into incoming/
        await d.wait_idle()

The daemon is the one ``qmgrd run`` runs: ``qmgrd.daemon.assemble.Daemon``
(spool, engine, control socket, metrics, listener), with a ``FakeClock`` when
the test hands one in and a spool without fsync (durability is not what these
tests are about, and fsync would dominate their run time). Agents are the
real ones from master.cf unless the test passes its own. The configuration
comes from ``tests.support.config.write_config``.

Everything binds 127.0.0.1 port 0; every wait is bounded by ``TIMEOUT``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosmtplib

from qmgrd.config import Config, load_config
from qmgrd.daemon.assemble import Daemon
from qmgrd.daemon.clock import Clock
from qmgrd.daemon.engine import Engine
from qmgrd.delivery.agent import Agent
from qmgrd.spool import Envelope, RecipientSpec, Spool
from tests.integration.sinks import SinkServer
from tests.support.config import write_config

__all__ = [
    "TIMEOUT",
    "InProcessDaemon",
    "commit",
    "message_bytes",
    "offline_spool",
    "running_daemon",
    "sent_events",
    "start_daemon",
    "status_events",
    "wait_for_messages",
    "write_config",
]

TIMEOUT = 30.0


def message_bytes(subject: str = "test", size: int = 0) -> bytes:
    """A small RFC 5322 message; ``size`` pads the body to about that many bytes."""
    head = f"From: s@src.test\r\nTo: r@dst.test\r\nSubject: {subject}\r\n\r\n".encode()
    body = b"hello\r\n"
    if size > len(head) + len(body):
        line = b"x" * 76 + b"\r\n"
        body = line * ((size - len(head)) // len(line))
    return head + body


def commit(
    spool: Spool,
    sender: str,
    recipients: Iterable[str],
    content: bytes | None = None,
    *,
    arrival_time: float,
) -> str:
    """Commit one message to ``incoming/`` directly, as the listener would (no wake-up)."""
    env = Envelope(
        sender=sender,
        recipients=tuple(RecipientSpec(r) for r in recipients),
        arrival_time=arrival_time,
        client_name="localhost",
        client_addr="127.0.0.1",
    )
    return spool.commit(env, content or message_bytes())


def offline_spool(conf: Path) -> Spool:
    """The spool of the configuration in ``conf``, for queueing mail before the daemon starts."""
    cfg = load_config(conf, hostname="mx.test")
    spool = Spool(cfg.get_path("queue_directory"), fsync=False)
    spool.ensure_dirs()
    return spool


@dataclass(slots=True, eq=False)
class InProcessDaemon:
    """One running in-process daemon (see the module docstring)."""

    parts: Daemon
    submitted: list[str] = field(default_factory=list)

    @property
    def cfg(self) -> Config:
        """The configuration it runs with."""
        return self.parts.cfg

    @property
    def spool(self) -> Spool:
        """Its spool."""
        return self.parts.spool

    @property
    def engine(self) -> Engine:
        """Its engine."""
        return self.parts.engine

    @property
    def clock(self) -> Clock:
        """The engine's clock (the test's ``FakeClock`` if it passed one)."""
        return self.parts.clock

    @property
    def task(self) -> asyncio.Task[None]:
        """The engine's task."""
        return self.parts.task

    @property
    def port(self) -> int:
        """The listener's bound port."""
        assert self.parts.listener is not None, "started without a listener"
        return self.parts.listener.addresses[0][1]

    async def submit(
        self, sender: str, recipients: Iterable[str], content: bytes | None = None
    ) -> str:
        """Send one message over SMTP to the listener; returns its queue id."""
        rcpts = list(recipients)
        async with aiosmtplib.SMTP(
            hostname="127.0.0.1", port=self.port, timeout=TIMEOUT, start_tls=False
        ) as client:
            return await self._send(client, sender, rcpts, content)

    async def submit_many(
        self,
        messages: list[tuple[str, list[str]]],
        *,
        clients: int = 4,
        content: bytes | None = None,
    ) -> list[str]:
        """Send ``(sender, recipients)`` messages over ``clients`` concurrent SMTP sessions."""
        ids: list[str | None] = [None] * len(messages)

        async def worker(first: int) -> None:
            async with aiosmtplib.SMTP(
                hostname="127.0.0.1", port=self.port, timeout=TIMEOUT, start_tls=False
            ) as client:
                for i in range(first, len(messages), clients):
                    sender, rcpts = messages[i]
                    ids[i] = await self._send(client, sender, rcpts, content)

        await asyncio.wait_for(
            asyncio.gather(*(worker(i) for i in range(min(clients, len(messages))))), TIMEOUT * 4
        )
        out = [qid for qid in ids if qid is not None]
        assert len(out) == len(messages)
        return out

    async def _send(
        self, client: aiosmtplib.SMTP, sender: str, rcpts: list[str], content: bytes | None
    ) -> str:
        _errors, reply = await client.sendmail(sender, rcpts, content or message_bytes())
        # "2.0.0 Ok: queued as ID"
        assert "queued as " in reply, reply
        qid = reply.rsplit(" ", 1)[-1]
        self.submitted.append(qid)
        return qid

    def enqueue(self, sender: str, recipients: Iterable[str], content: bytes | None = None) -> str:
        """Commit a message straight into ``incoming/`` and wake the engine (no SMTP)."""
        qid = commit(self.spool, sender, recipients, content, arrival_time=self.clock.now())
        self.submitted.append(qid)
        self.engine.notify_incoming(qid)
        return qid

    async def wait_idle(self, timeout: float = TIMEOUT) -> None:
        """Wait until nothing is in core or pending (the engine task must still run)."""
        idle = asyncio.ensure_future(self.engine.wait_idle())
        done, _ = await asyncio.wait(
            {idle, self.task}, timeout=timeout, return_when="FIRST_COMPLETED"
        )
        if self.task in done:
            idle.cancel()
            self.task.result()
            raise AssertionError("the engine stopped while waiting for idle")
        if idle not in done:
            idle.cancel()
            raise AssertionError(f"engine not idle after {timeout}s: {self.engine.stats}")

    def queue_ids(self, queue: str) -> list[str]:
        """The queue ids in one spool queue."""
        return self.spool.list_ids(queue)

    async def stop(self) -> None:
        """Stop the daemon (listener first, engine last) and wait for it (bounded)."""
        await asyncio.wait_for(self.parts.stop(), TIMEOUT)


async def start_daemon(
    conf: Path,
    *,
    clock: Clock | None = None,
    agents: dict[str, Agent] | None = None,
    listen: bool = True,
    fsync: bool = False,
) -> InProcessDaemon:
    """Start the engine (recovery and the incoming scan run first) and, with ``listen``, SMTP."""
    cfg = load_config(conf, hostname="mx.test")
    parts = Daemon(cfg, clock=clock, fsync=fsync, agents=agents)
    await asyncio.wait_for(parts.start(listen=listen), TIMEOUT)
    return InProcessDaemon(parts)


@contextlib.asynccontextmanager
async def running_daemon(
    conf: Path,
    *,
    clock: Clock | None = None,
    agents: dict[str, Agent] | None = None,
    listen: bool = True,
    fsync: bool = False,
) -> AsyncIterator[InProcessDaemon]:
    """``start_daemon`` as a context manager that always stops the daemon."""
    daemon = await start_daemon(conf, clock=clock, agents=agents, listen=listen, fsync=fsync)
    try:
        yield daemon
    finally:
        await daemon.stop()


async def wait_for_messages(sink: SinkServer, count: int, timeout: float = TIMEOUT) -> None:
    """Wait until the sink accepted ``count`` messages (woken by each one, no polling)."""
    await sink.wait_messages(count, timeout)


def sent_events(logs: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(queue id, address) of every ``status=sent`` event in captured logs."""
    return [
        (str(e.get("queue_id")), str(e["to"]).strip("<>"))
        for e in logs
        if e.get("status") == "sent"
    ]


def status_events(logs: Sequence[Mapping[str, Any]], status: str) -> list[Mapping[str, Any]]:
    """Captured events with ``status`` (``sent``, ``deferred``, ``bounced``)."""
    return [e for e in logs if e.get("status") == status]
