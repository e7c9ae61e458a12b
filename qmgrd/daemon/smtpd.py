"""A listener worker process: SMTP intake, cleanup and spool commits on a loop of its own.

Started by the queue manager (``qmgrd.daemon.workers``) as ``python -m
qmgrd.daemon.smtpd -c DIR --channel FD --slot I --slots N --parent PID
--spool DIR [--tokens FD] --listen SERVICE=FD[,FD...]...``; never by hand. It:

- is named ``qmgrd-smtpd`` (``PR_SET_NAME``) and dies with its parent:
  ``PR_SET_PDEATHSIG`` (SIGKILL) on Linux, and a parent that is already
  gone (``getppid`` differs) ends it at once, so a SIGKILLed daemon leaves
  no worker accepting mail behind it; the channel's end of stream also
  stops it (gracefully);
- reads the configuration itself (as a new Postfix smtpd does: a worker
  restarted after main.cf was edited but not reloaded runs the edited
  settings) and opens its own log output (its lines are
  ``qmgrd/smtpd[PID]``); the spool is the queue manager's (``--spool``),
  never a ``queue_directory`` changed meanwhile;
- serves the listening sockets it inherited (``--listen``: the fds the
  parent bound, per master.cf service) with the same ``ListenerGroup`` the
  in-process mode runs, so every listener hook (limits, cleanup, TLS, AUTH)
  behaves the same; queue ids come from its own ``slot`` of ``slots``
  (``QueueIdGenerator``), so processes never draw the same id, and it
  reuses pooled queue files from its own part of ``recycle/``
  (``qmgrd.spool.recycle``: worker ``slot`` of ``slots - 1``);
- reports each durable commit and its intake counts over the channel
  (``qmgrd.daemon.ipc``; what is sent in one pass of the loop goes out in
  one write, ``Outbox``) and says ``ready`` once it listens;
- asks the queue manager for the per-client counts of
  ``smtpd_client_connection_count_limit`` and ``smtpd_client_auth_rate_limit``
  (``qmgrd.daemon.anvil``: Postfix's anvil is one server for every smtpd;
  no answer within ``ANVIL_WAIT``: this process's own count, logged once);
- reports its learned session cap and its loop lag's samples every
  ``ipc.LOAD_INTERVAL`` (``["load", ...]``: per-worker series in /metrics);
  with no session live the lag is sampled up to every 100 ms instead of
  every 10 ms (``qmgrd.daemon.looplag``: an idle worker wakes less);
- runs fair admission's intake gate (``WorkerFlowGate``): MAIL FROM of a
  flow over ``qmgr_flow_backlog_limit`` gets ``452 4.3.2``, from the set of
  such flows the queue manager sends (``["over", keys]``) when it changes;
- runs the regulator's intake gate (``intakeflow.WorkerRegulator``) when
  given ``--tokens FD``, the inherited read end of the queue manager's
  ``in_flow_delay`` token pipe: each MAIL takes a token from that pipe
  (waiting up to ``in_flow_delay``), ``421 4.3.2`` while the queue manager
  says it is over ``in_flow_backlog_limit`` (``["backlog", bool]``) or this
  loop lags past ``in_flow_lag_limit``, and the learned session cap of this
  loop (``qmgrd.core.sessioncap``);
- on ``hup`` reopens its log file and, when the queue manager accepted the
  reload, re-reads the configuration (a failure keeps the running settings,
  logged); on SIGTERM or end of channel it stops accepting, disconnects its
  clients and waits for queued commits (``ListenerHandle.wait_closed``'s
  bound), then exits 0. SIGINT and SIGHUP are ignored: the queue manager
  forwards what concerns the workers.

A configuration or start-up error is logged and the exit status is 1.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qmgrd.cleanup import CleanupSettings
from qmgrd.config import Config, load_config
from qmgrd.daemon.admitting import REFUSE_REPLY, admission_settings, flow_or_none
from qmgrd.daemon.anvil import AnvilClient
from qmgrd.daemon.intakeflow import FlowSettings, WorkerRegulator
from qmgrd.daemon.ipc import (
    LOAD_INTERVAL,
    CountingIntake,
    LoadReport,
    close_channel,
    encode,
    encode_commit,
    serve_commands,
)
from qmgrd.daemon.process import worker_main, worker_signals
from qmgrd.errors import ConfigError
from qmgrd.listener.flowgate import FlowFacts
from qmgrd.listener.group import ListenerGroup
from qmgrd.listener.observer import Committed
from qmgrd.listener.services import listener_settings
from qmgrd.log import get_logger, reopen_logs
from qmgrd.spool import QueueIdGenerator, Spool
from qmgrd.spool.recycle import Recycler

WORKER_ACCEPT_BATCH = 4  # connections per wake-up: workers share each listening socket


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="qmgrd-smtpd")
    parser.add_argument("-c", dest="config_dir", type=Path, required=True)
    parser.add_argument("--channel", type=int, required=True)
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--spool", type=Path, required=True)
    parser.add_argument("--listen", action="append", default=[])
    parser.add_argument("--tokens", type=int, default=None)
    return parser.parse_args(argv)


def _sockets(specs: Sequence[str]) -> dict[str, list[socket.socket]]:
    """``SERVICE=FD,FD`` arguments as inherited listening sockets by service."""
    out: dict[str, list[socket.socket]] = {}
    for spec in specs:
        service, _, fds = spec.partition("=")
        out[service] = [socket.socket(fileno=int(fd)) for fd in fds.split(",") if fd]
    return out


class Outbox:
    """The channel to the queue manager, written once per pass of the loop.

    The commit notices of a group commit's batch (and whatever else is sent
    meanwhile) go out in one write, in the order sent: one system call and
    one wake-up of the queue manager instead of one per message. Nothing is
    sent before ``open`` or once the channel is closing.
    """

    __slots__ = ("_loop", "_pending", "_writer")

    def __init__(self) -> None:
        self._writer: asyncio.StreamWriter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[bytes] = []

    def open(self, writer: asyncio.StreamWriter) -> None:
        """Write to ``writer`` from now on (on the running loop)."""
        self._writer = writer
        self._loop = asyncio.get_running_loop()

    def send(self, data: bytes) -> None:
        """Queue one encoded message; written at the end of this pass of the loop."""
        writer = self._writer
        if writer is None or self._loop is None or writer.is_closing():
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        """Write what is queued now (also called before the channel closes)."""
        data = b"".join(self._pending)
        self._pending.clear()
        if data and self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)


class WorkerFlowGate:
    """Fair admission's intake gate in a worker (``qmgrd.listener.flowgate.FlowGate``).

    ``refuse`` answers from the flow keys over their backlog that the queue manager
    last sent (``over``); ``committed`` does nothing: the commit notice carries the facts.
    """

    __slots__ = ("_flow_fn", "_limit", "over")

    def __init__(self, cfg: Config) -> None:
        """The fairness key and backlog limit of ``cfg`` (ConfigError for a bad table)."""
        settings = admission_settings(cfg)
        self._flow_fn = settings.flow_fn()
        self._limit = settings.limits.backlog_limit
        self.over: frozenset[str] = frozenset()

    def refuse(self, facts: FlowFacts) -> str | None:
        """``REFUSE_REPLY`` when the flow of ``facts`` is over its backlog limit."""
        if self._limit <= 0 or not self.over:
            return None
        try:
            key = flow_or_none(self._flow_fn, facts).key
        except Exception:  # a table that fails must not stop intake
            return None
        return REFUSE_REPLY if key in self.over else None

    def committed(self, queue_id: str, facts: FlowFacts) -> None:
        """Nothing: the commit notice carries the facts."""


class Worker:
    """One worker's running state (see the module doc)."""

    def __init__(self, args: argparse.Namespace, cfg: Config) -> None:
        self.args = args
        self.cfg = cfg
        self.spool = Spool(
            args.spool,  # the running queue manager's, whatever main.cf says now
            ids=QueueIdGenerator(
                long_ids=self.cfg.get_bool("enable_long_queue_ids"),
                slot=args.slot,
                slots=args.slots,
            ),
        )
        self.log = get_logger("smtpd")
        self.stop = asyncio.Event()
        self.writer: asyncio.StreamWriter | None = None
        self.outbox = Outbox()
        self.intake = CountingIntake(self.send)
        self.group: ListenerGroup | None = None
        self.gate = WorkerFlowGate(cfg)
        self.anvil = AnvilClient(self.send)  # per-client limits: the queue manager counts
        self.regulator: WorkerRegulator | None = None
        if args.tokens is not None:  # regulator: the queue manager's token pipe, inherited
            self.regulator = WorkerRegulator(args.tokens, FlowSettings.from_config(cfg))
            self.regulator.sessions = lambda: self.intake.sessions
            self.intake.gate = self.regulator.gate
            regulator = self.regulator  # no session: the loop lag is sampled less often
            regulator.lag.idle = lambda: regulator.live() == 0

    def send(self, data: bytes) -> None:
        """Queue one message to the queue manager (dropped once the channel is closed)."""
        self.outbox.send(data)

    def committed(self, c: Committed) -> None:
        self.send(encode_commit(c))

    async def run(self) -> None:
        worker_signals(self.stop)
        reader, self.writer = await asyncio.open_unix_connection(
            sock=socket.socket(fileno=self.args.channel)
        )
        self.outbox.open(self.writer)
        cleanup = CleanupSettings.from_config(self.cfg)
        parts = max(1, self.args.slots - 1)
        self.group = await ListenerGroup.start(
            listener_settings(self.cfg, cleanup=cleanup),
            self.spool,
            on_commit=self.committed,
            observer=self.intake,
            gate=self.gate,
            sockets=_sockets(self.args.listen),
            accept_batch=WORKER_ACCEPT_BATCH,
            # Workers are slots 1..slots-1: each claims its own part of the pool.
            recycler=Recycler(
                str(self.args.spool), part=(self.args.slot - 1) % parts, parts=parts
            ),
        )
        for handle in (self.group.main, *self.group.services.values()):
            handle.ctx.anvil = self.anvil.service(handle.settings.service)
            if self.regulator is not None:  # regulator: on this process's own loop
                handle.ctx.inflow = self.regulator.gate
        report: asyncio.Task[None] | None = None
        if self.regulator is not None:
            self.regulator.start()
            report = asyncio.get_running_loop().create_task(self._report_load(self.regulator))
        try:
            await serve_commands(reader, self._command, self.log, self.stop, self.send)
        finally:
            if report is not None:
                report.cancel()
            if self.regulator is not None:
                self.regulator.stop()
            await self.group.aclose()
            self.anvil.close()
            self.intake.flush()
            self.outbox.flush()
            await close_channel(self.writer)

    def _command(self, fields: list[Any]) -> None:
        if fields[0] == "anvil":
            self.anvil.answer(fields)
        elif fields[0] == "over":
            self.gate.over = frozenset(str(k) for k in fields[1])
        elif fields[0] == "backlog" and self.regulator is not None:
            self.regulator.over_backlog = fields[1] is True
        elif fields[0] == "hup":
            reopen_logs()
            if len(fields) > 1 and fields[1] is True:
                self.reload()
            self.send(encode("hup-done"))

    async def _report_load(self, regulator: WorkerRegulator) -> None:
        """Send the session cap and the loop lag's new samples every ``LOAD_INTERVAL``."""
        report = LoadReport(regulator.lag, lambda: regulator.cap.limit)
        while True:
            await asyncio.sleep(LOAD_INTERVAL)
            self.send(report.message())

    def reload(self) -> None:
        """Apply the configuration files again; a failure keeps the running settings."""
        try:
            cfg = load_config(self.args.config_dir)
            settings = listener_settings(cfg, cleanup=CleanupSettings.from_config(cfg))
            gate = WorkerFlowGate(cfg)
            flow = FlowSettings.from_config(cfg)
        except (ConfigError, ValueError) as exc:
            self.log.error(f"reload refused, keeping the running configuration: {exc}")
            return
        self.cfg = cfg
        gate.over = self.gate.over
        self.gate = gate  # new sessions; the group's listeners keep the context's gate
        if self.group is not None:
            for handle in (self.group.main, *self.group.services.values()):
                handle.ctx.gate = gate
        if self.regulator is not None:
            self.regulator.configure(flow)  # regulator: in_flow_* settings
        if self.group is not None:
            self.group.update(settings)


def main(argv: Sequence[str] | None = None) -> int:
    """The worker process (module doc); its exit status."""
    args = _arguments(sys.argv[1:] if argv is None else argv)
    return worker_main(
        args.parent,
        args.config_dir,
        name="qmgrd-smtpd",
        program="smtpd",
        body=lambda cfg: Worker(args, cfg).run(),
    )


if __name__ == "__main__":
    sys.exit(main())
