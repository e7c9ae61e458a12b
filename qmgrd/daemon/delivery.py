"""A delivery worker process: the queue manager's SMTP deliveries on a loop of their own.

Started by the queue manager (``qmgrd.daemon.dpool``) as ``python -m
qmgrd.daemon.delivery -c DIR --channel FD --parent PID``; never by hand. It:

- is named ``qmgrd-delivery`` and dies with its parent
  (``process.die_with_parent``): a SIGKILLed daemon leaves no worker
  delivering mail behind it;
- reads the configuration itself and builds its agents with the factory the
  queue manager uses (``wiring.create_agents``), opens its own log output
  (the agents' lines are ``qmgrd/smtp[PID]``) and says ``ready``;
- for each ``d`` request (``qmgrd.daemon.dwire``) runs the transport's
  agent on the request (the content streamed from the queue file it names;
  the first reads of many deliveries share a thread hop, ``IoBatcher``)
  and answers ``r`` with the result (the results of one loop turn in one
  write, ``LineWriter``), or ``x`` when the agent raised (a bug
  met by one delivery: logged here, a crash result in the queue manager; an
  ``InvariantError`` stops the queue manager, as in process) or the
  transport is unknown; deliveries run concurrently, as in the queue
  manager. It writes nothing to the spool: outcomes, done marks and logs of
  recipient outcomes stay with the queue manager. ``k`` cancels a delivery;
- on ``["hup", accepted]`` reopens its log file and, when the queue manager
  accepted the reload, builds new agents from the configuration files (a
  failure keeps the running ones, logged); deliveries in progress finish on
  the old agents, which are closed after them; then answers ``hup-done``;
- on SIGTERM or end of channel refuses new requests (``x``), lets those in
  progress finish within ``shutdown_timeout`` (their results are sent),
  cancels the rest (the queue manager defers them), closes its agents (QUIT
  of cached sessions) and exits 0. SIGINT and SIGHUP are ignored: the queue
  manager forwards what concerns the workers.

A configuration or start-up error is logged and the exit status is 1.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from qmgrd.config import Config, load_config
from qmgrd.daemon.dispatch import close_agents
from qmgrd.daemon.dpool import INTERNAL
from qmgrd.daemon.dwire import LineWriter, decode_request, encode_result
from qmgrd.daemon.iobatch import IoBatcher
from qmgrd.daemon.ipc import close_channel, encode, serve_commands
from qmgrd.daemon.process import worker_main, worker_signals
from qmgrd.daemon.wiring import create_agents
from qmgrd.delivery.agent import Agent, DeliveryRequest
from qmgrd.errors import ConfigError, InvariantError
from qmgrd.log import get_logger, reopen_logs


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="qmgrd-delivery")
    parser.add_argument("-c", dest="config_dir", type=Path, required=True)
    parser.add_argument("--channel", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    return parser.parse_args(argv)


class DeliveryWorker:
    """One delivery worker's running state (see the module doc)."""

    def __init__(self, args: argparse.Namespace, cfg: Config) -> None:
        self.args = args
        self.cfg = cfg
        self.agents: dict[str, Agent] = create_agents(cfg)
        self.log = get_logger("smtp")
        self.stop = asyncio.Event()
        self.writer: asyncio.StreamWriter | None = None
        self.lines: LineWriter | None = None  # results, one write per loop turn
        self.io = IoBatcher()  # the content's first reads, many per thread hop
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def send(self, data: bytes) -> None:
        """Queue one message to the queue manager (dropped once the channel is closed)."""
        if self.lines is not None:
            self.lines.write(data)

    async def run(self) -> None:
        worker_signals(self.stop)
        reader, self.writer = await asyncio.open_unix_connection(
            sock=socket.socket(fileno=self.args.channel), limit=1 << 20
        )
        self.lines = LineWriter(self.writer)
        try:
            await serve_commands(reader, self._command, self.log, self.stop, self.send)
        finally:
            await self._finish()

    async def _finish(self) -> None:
        """Let deliveries in progress end (``shutdown_timeout``), close the agents."""
        tasks = set(self.tasks.values())
        if tasks:
            wait = self.cfg.get_time("shutdown_timeout")
            _done, pending = await asyncio.wait(tasks, timeout=wait)
            for task in pending:
                task.cancel()
            if pending:
                self.log.warning("deliveries cancelled at shutdown", count=len(pending))
                await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.gather(*self._closing, return_exceptions=True)
        await close_agents(self.agents.values(), self.log)
        if self.lines is not None:
            self.lines.flush()
        if self.writer is not None:
            await close_channel(self.writer)

    def _command(self, fields: list[Any]) -> None:
        kind = fields[0]
        if kind == "d":
            n, request = decode_request(fields, self.io.submit)
            agent = self.agents.get(request.transport)
            if self.stop.is_set() or agent is None:
                why = "stopping" if agent is not None else f"no transport {request.transport}"
                self.send(encode("x", n, f"delivery process: {why}"))
                return
            task = asyncio.get_running_loop().create_task(self._deliver(n, agent, request))
            self.tasks[n] = task
            task.add_done_callback(partial(self._done, n))
        elif kind == "k":
            running = self.tasks.get(int(fields[1]))
            if running is not None:
                running.cancel()
        elif kind == "hup":
            reopen_logs()
            if len(fields) > 1 and fields[1] is True:
                self.reload()
            # after the log's flush (queued by the lines above): READY=1 follows every line
            asyncio.get_running_loop().call_soon(self.send, encode("hup-done"))
        else:
            raise ValueError(f"unknown message {kind!r}")

    def _done(self, n: int, _task: asyncio.Task[None]) -> None:
        self.tasks.pop(n, None)

    async def _deliver(self, n: int, agent: Agent, request: DeliveryRequest) -> None:
        try:
            result = await agent.deliver(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # InvariantError too: the queue manager decides
            self.log.error(
                "delivery agent failed",
                queue_id=request.queue_id,
                transport=request.transport,
                error=repr(exc),
            )
            kind = INTERNAL if isinstance(exc, InvariantError) else "error:"
            self.send(encode("x", n, f"{kind} {exc!r}"))
            return
        self.send(encode_result(n, request, result))

    def reload(self) -> None:
        """New agents from the configuration files; a failure keeps the running ones."""
        try:
            cfg = load_config(self.args.config_dir)
            agents = create_agents(cfg)
        except (ConfigError, ValueError) as exc:
            self.log.error(f"reload refused, keeping the running configuration: {exc}")
            return
        old, self.agents, self.cfg = self.agents, agents, cfg
        task = asyncio.get_running_loop().create_task(
            self._close_after(list(old.values()), set(self.tasks.values()))
        )
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        self.log.info("configuration reloaded")

    async def _close_after(self, agents: list[Agent], tasks: set[asyncio.Task[None]]) -> None:
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await close_agents(agents, self.log)


def main(argv: Sequence[str] | None = None) -> int:
    """The worker process (module doc); its exit status."""
    args = _arguments(sys.argv[1:] if argv is None else argv)

    async def body(cfg: Config) -> None:  # the agents are built on the loop, as in qmgr
        await DeliveryWorker(args, cfg).run()

    return worker_main(
        args.parent, args.config_dir, name="qmgrd-delivery", program="smtp", body=body
    )


if __name__ == "__main__":
    sys.exit(main())
