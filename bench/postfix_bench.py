"""The standard relay benchmark: Postfix's smtp-source into the relay, relayed to smtp-sink.

    apt-get install postfix        # provides smtp-source, smtp-sink (and Postfix itself)
    .venv/bin/python bench/postfix_bench.py                         # all shapes, 3 rounds
    .venv/bin/python bench/postfix_bench.py --shapes 1k --rounds 5 -m 3000
    .venv/bin/python bench/postfix_bench.py --relays qmgrd          # without Postfix

The workload is ``smtp-source -s 20 -m 3000 -l SIZE [-r RCPTS]``: a new SMTP
session per message, 20 in parallel, into the relay on a loopback port; the
relay sends everything to ``smtp-sink`` processes on loopback. The time runs
from the start of smtp-source (its first connection) to the relay's last
``status=sent`` log line (its log file is followed every 5 ms). Shapes:

- ``1k``: 1 KB, 1 recipient; ``100k``: 100 KB, 1 recipient;
- ``1k10r``: 1 KB, 10 recipients of one destination;
- ``1k10r10d``: 1 KB, 10 recipients over 10 destinations: ``transport_maps``
  sends ``Nto@dst.bench`` to the sink on port N (ten sinks, ten queues).

qmgrd runs as ``python -m qmgrd run`` with a temporary spool and main.cf. When
Postfix is installed (``postfix``, ``smtp-source`` and ``smtp-sink`` in PATH or
/usr/sbin) and the bench runs as root, a private Postfix instance is started
for each run with its own config_directory, queue_directory and data_directory
under a temporary directory, listening on 127.0.0.1 only (``postfix -c DIR
start``; nothing of the system's Postfix is used or touched). Runs alternate,
qmgrd then Postfix, for ``--rounds`` rounds per shape; each run gets a fresh
relay and fresh sinks.

Printed per run: msg/s, rcpt/s, CPU ms per message of the relay (total over its
processes, then per process name; see ``bench/procwatch.py``), of the sinks and
of smtp-source, and the relay's peak memory: the sum of its processes'
proportional set sizes (PSS) and the largest single peak RSS (VmHWM). Per shape:
median and min-max over rounds, and the ratio qmgrd/Postfix of msg/s per round.
A benchmark prints; nothing is asserted. Everything binds to 127.0.0.1; each
run is bounded by ``--timeout``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.procwatch import Tree, Usage, descendants, sample  # a sibling script, not a package

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Shape:
    """One workload of the table."""

    name: str
    label: str
    size: int
    rcpts: int
    dests: int


SHAPES = {
    s.name: s
    for s in (
        Shape("1k", "1 KB, 1 recipient", 1024, 1, 1),
        Shape("100k", "100 KB, 1 recipient", 102400, 1, 1),
        Shape("1k10r", "1 KB, 10 recipients", 1024, 10, 1),
        Shape("1k10r10d", "1 KB, 10 recipients, 10 destinations", 1024, 10, 10),
    )
}


def tool(name: str) -> str | None:
    """The path of a Postfix program (PATH, then /usr/sbin), or None."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    return found


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Return once 127.0.0.1:port accepts connections; RuntimeError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def wait_line(path: Path, needle: str, timeout: float) -> None:
    """Return once the file ``path`` holds ``needle``; RuntimeError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            if needle in path.read_text(errors="replace"):
                return
        time.sleep(0.05)
    raise RuntimeError(f"no {needle!r} in {path} after {timeout} s")


def transport_map(path: Path, ports: Sequence[int]) -> None:
    """``Nto@dst.bench smtp:[127.0.0.1]:port_N`` for the 10-destination shape."""
    lines = [f"{i}to@dst.bench smtp:[127.0.0.1]:{port}" for i, port in enumerate(ports, 1)]
    path.write_text("\n".join(lines) + "\n")


@dataclass(slots=True)
class LogTail:
    """Follow a log file: count status=sent lines; note when the last expected one came."""

    path: Path
    want: int
    sent: int = 0
    problems: int = 0
    first_problem: str = ""
    last_sent: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def follow(self) -> None:
        """Poll every 5 ms from the current end of the file until ``want`` or ``stop``."""
        pos = self.path.stat().st_size if self.path.exists() else 0
        rest = b""
        while not self.stop.is_set():
            try:
                with self.path.open("rb") as f:
                    f.seek(pos)
                    chunk = f.read()
            except FileNotFoundError:
                chunk = b""
            now = time.perf_counter()
            pos += len(chunk)
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                if b"status=sent" in line:
                    self.sent += 1
                    if self.sent == self.want:
                        self.last_sent = now
                        self.done.set()
                elif b"status=deferred" in line or b"status=bounced" in line:
                    self.problems += 1
                    self.first_problem = self.first_problem or line.decode(errors="replace")
            self.stop.wait(0.005)


class Relay:
    """A relay under test: start it on ``port`` relaying to the sinks, stop it."""

    name = ""

    def start(self, root: Path, port: int, sinks: Sequence[int], shape: Shape) -> None:
        """Start the relay; return once it accepts SMTP."""
        raise NotImplementedError

    def roots(self) -> list[int]:
        """The pids whose process trees are the relay."""
        raise NotImplementedError

    @property
    def log(self) -> Path:
        """The relay's log file."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the relay and wait for its processes (bounded)."""
        raise NotImplementedError


class Qmgrd(Relay):
    """``python -m qmgrd run`` with a temporary spool."""

    name = "qmgrd"

    def __init__(
        self, workers: str | None = None, main_cf: Sequence[str] = (), delivery: str | None = None
    ) -> None:
        """Nothing runs yet; ``workers``: smtpd_worker_processes (None: its default);
        ``main_cf``: extra main.cf lines (``--qmgrd-main``); ``delivery``:
        delivery_worker_processes (None: its default)."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.root = Path()
        self.workers = workers
        self.delivery = delivery
        self.name = "qmgrd" if workers is None else f"qmgrd-w{workers}"
        if delivery is not None:
            self.name += f"-d{delivery}"
        self.main_cf = "".join(line + "\n" for line in main_cf)

    def start(self, root: Path, port: int, sinks: Sequence[int], shape: Shape) -> None:
        """Write main.cf/master.cf under ``root`` and start the daemon."""
        self.root = root
        conf = root / "etc"
        conf.mkdir()
        extra = ""
        if shape.dests > 1:
            transport_map(conf / "transport", sinks)
            extra = f"transport_maps = texthash:{conf / 'transport'}\n"
        if self.workers is not None:
            extra += f"smtpd_worker_processes = {self.workers}\n"
        if self.delivery is not None:
            extra += f"delivery_worker_processes = {self.delivery}\n"
        (conf / "main.cf").write_text(
            f"queue_directory = {root / 'spool'}\n"
            f"smtpd_listen = 127.0.0.1:{port}\n"
            "myhostname = relay.bench\n"
            "mynetworks = 127.0.0.0/8\n"
            f"relayhost = [127.0.0.1]:{sinks[0]}\n"
            f"maillog_file = {root / 'maillog'}\n" + extra + self.main_cf
        )
        (conf / "master.cf").write_text((REPO / "config" / "master.cf").read_text())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qmgrd", "-c", str(conf), "run"],
            cwd=str(REPO),
            stdout=subprocess.DEVNULL,
            stderr=(root / "stderr").open("wb"),
        )
        try:
            wait_port(port, 60, self.proc)
            wait_line(root / "maillog", "daemon started", 60)  # listener workers listen
        except RuntimeError as exc:
            raise RuntimeError(f"qmgrd: {exc}: {(root / 'stderr').read_text()[-2000:]}") from exc

    def roots(self) -> list[int]:
        """The daemon process."""
        assert self.proc is not None
        return [self.proc.pid]

    @property
    def log(self) -> Path:
        """maillog_file."""
        return self.root / "maillog"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


class Floor(Relay):
    """``bench/floorrelay.py``: the least a single-process Python relay spends (not a mail server).

    ``floor`` makes each message durable (fsync, group commit) before its 250
    reply, as every real relay does; ``floor-mem`` keeps messages in memory only.
    """

    def __init__(self, durable: bool) -> None:
        """Nothing runs yet."""
        self.name = "floor" if durable else "floor-mem"
        self.durable = durable
        self.proc: subprocess.Popen[bytes] | None = None
        self.root = Path()

    def start(self, root: Path, port: int, sinks: Sequence[int], shape: Shape) -> None:
        """Start the floor relay on ``port``."""
        self.root = root
        cmd = [sys.executable, str(REPO / "bench" / "floorrelay.py"), "--port", str(port)]
        cmd += ["--sinks", ",".join(map(str, sinks)), "--log", str(root / "maillog")]
        if self.durable:
            (root / "spool").mkdir()
            cmd += ["--spool", str(root / "spool")]
        err = (root / "stderr").open("wb")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        wait_port(port, 60, self.proc)

    # roots, log (its status=sent lines) and stop: Qmgrd's (one process, maillog under root).
    roots = Qmgrd.roots
    log = Qmgrd.log
    stop = Qmgrd.stop


_POSTFIX_MASTER = """\
127.0.0.1:{port} inet n - n - - smtpd
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
proxywrite unix -       -       n       -       1       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
"""


class Postfix(Relay):
    """A private Postfix instance: its own config, queue and data directories under ``root``.

    Debian's master.cf services without chroot, smtpd on 127.0.0.1 only, Postfix
    defaults otherwise (fsync, process limits, connection cache on demand).
    """

    name = "postfix"

    def __init__(self, postfix: str) -> None:
        """``postfix``: the path of the postfix command."""
        self.postfix = postfix
        self.root = Path()
        self.master = 0

    def _command(self, action: str) -> str:
        """Run ``postfix -c DIR action`` on a pty (Postfix prints errors only to a tty)."""
        main_fd, tty_fd = os.openpty()
        try:
            proc = subprocess.run(
                [self.postfix, "-c", str(self.root / "etc"), action],
                stdin=subprocess.DEVNULL,
                stdout=tty_fd,
                stderr=tty_fd,
                timeout=60,
                check=False,
            )
            os.set_blocking(main_fd, False)
            try:
                output = os.read(main_fd, 65536).decode(errors="replace")
            except (BlockingIOError, OSError):
                output = ""
        finally:
            os.close(main_fd)
            os.close(tty_fd)
        if proc.returncode != 0:
            raise RuntimeError(f"postfix {action} failed ({proc.returncode}): {output.strip()}")
        return output

    def start(self, root: Path, port: int, sinks: Sequence[int], shape: Shape) -> None:
        """Write main.cf/master.cf, create the directories, ``postfix -c DIR start``."""
        self.root = root
        root.chmod(0o755)  # the postfix user must reach its queue
        conf = root / "etc"
        conf.mkdir()
        (root / "queue").mkdir()
        (root / "data").mkdir()
        shutil.chown(root / "data", user="postfix")
        extra = ""
        if shape.dests > 1:
            transport_map(conf / "transport", sinks)
            extra = f"transport_maps = texthash:{conf / 'transport'}\n"
        (conf / "main.cf").write_text(
            "compatibility_level = 3.6\n"
            f"queue_directory = {root / 'queue'}\n"
            f"data_directory = {root / 'data'}\n"
            "mail_owner = postfix\nsetgid_group = postdrop\n"
            "myhostname = relay.bench\nmydestination =\n"
            "inet_interfaces = 127.0.0.1\ninet_protocols = ipv4\n"
            "mynetworks = 127.0.0.0/8\n"
            "smtpd_relay_restrictions = permit_mynetworks, reject\n"
            f"relayhost = [127.0.0.1]:{sinks[0]}\n"
            f"maillog_file = {root / 'maillog'}\nmaillog_file_prefixes = {root}\n"
            "alias_maps =\nalias_database =\nlocal_recipient_maps =\nbiff = no\n" + extra
        )
        (conf / "master.cf").write_text(_POSTFIX_MASTER.format(port=port))
        self._command("start")
        wait_port(port, 60)
        pid_file = root / "queue" / "pid" / "master.pid"
        self.master = int(pid_file.read_text().split()[0])

    def roots(self) -> list[int]:
        """The master process (every daemon is its child)."""
        return [self.master]

    @property
    def log(self) -> Path:
        """maillog_file (written by postlogd)."""
        return self.root / "maillog"

    def stop(self) -> None:
        """``postfix stop``, wait for the master and its daemons; SIGKILL what remains."""
        if not self.master:
            return
        pids = descendants([self.master])
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._command("stop")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
        for pid in pids:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):  # it ended after the check
                    os.kill(pid, signal.SIGKILL)
        self.master = 0


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: it ended while being read
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass(slots=True)
class Run:
    """One run's numbers."""

    relay: str
    shape: Shape
    round: int
    messages: int
    elapsed: float
    relay_cpu: Usage
    sink_cpu: float
    source_cpu: float
    problems: int

    @property
    def rate(self) -> float:
        """Messages per second."""
        return self.messages / self.elapsed

    def line(self) -> str:
        """One human-readable line."""
        n = self.messages
        parts = sorted(self.relay_cpu.by_name.items(), key=lambda kv: -kv[1])
        per = " ".join(
            f"{name}={cpu * 1000 / n:.2f}" for name, cpu in parts if cpu * 1000 / n >= 0.005
        )
        return (
            f"{self.shape.name:<9} round={self.round} {self.relay:<7} {self.rate:6.0f} msg/s "
            f"{self.rate * self.shape.rcpts:7.0f} rcpt/s  wall={self.elapsed:6.2f}s  "
            f"cpu ms/msg: relay={self.relay_cpu.total_cpu * 1000 / n:.2f} [{per}] "
            f"sink={self.sink_cpu * 1000 / n:.2f} source={self.source_cpu * 1000 / n:.2f}  "
            f"peak_pss={self.relay_cpu.peak_pss / MIB:.1f}MiB "
            f"hwm={self.relay_cpu.largest[1] / MIB:.1f}MiB ({self.relay_cpu.largest[0]})  "
            f"problems={self.problems}"
        )


def _cpu(pid: int) -> float:
    found = sample(pid)
    return found.cpu if found else 0.0


def run_once(
    relay: Relay, shape: Shape, rnd: int, args: argparse.Namespace, tools: dict[str, str]
) -> Run:
    """Sinks, relay, smtp-source, wait for the last status=sent; everything stopped after."""
    root = Path(tempfile.mkdtemp(prefix=f"bench-{relay.name}-"))
    sink_ports = [free_port() for _ in range(shape.dests)]
    as_root = ["-u", "nobody"] if os.geteuid() == 0 else []  # smtp-sink refuses root
    sinks = [
        subprocess.Popen(
            [tools["smtp-sink"], *as_root, f"127.0.0.1:{p}", "256"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in sink_ports
    ]
    tail: LogTail | None = None
    source: subprocess.Popen[bytes] | None = None
    try:
        for port, sink in zip(sink_ports, sinks, strict=True):
            wait_port(port, 30, sink)
        port = free_port()
        relay.start(root, port, sink_ports, shape)
        tail = LogTail(relay.log, want=args.m * shape.rcpts)
        threading.Thread(target=tail.follow, daemon=True).start()
        tree = Tree(relay.roots())
        sink_cpu0 = sum(_cpu(s.pid) for s in sinks)
        tree.start()
        cmd = [tools["smtp-source"], "-s", str(args.s), "-m", str(args.m), "-l", str(shape.size)]
        if shape.rcpts > 1:
            cmd += ["-r", str(shape.rcpts)]
        cmd += ["-f", "a@src.bench", "-t", "to@dst.bench", "-M", "src.bench", f"127.0.0.1:{port}"]
        t0 = time.perf_counter()
        with (root / "source.err").open("wb") as err_file:
            source = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file)
        _pid, status, rusage = os.wait4(source.pid, 0)  # its CPU time comes with the status
        source.returncode = os.waitstatus_to_exitcode(status)
        source_cpu = rusage.ru_utime + rusage.ru_stime
        if source.returncode != 0:
            err = (root / "source.err").read_text(errors="replace")
            raise RuntimeError(f"smtp-source failed ({source.returncode}): {err.strip()[-500:]}")
        if not tail.done.wait(max(1.0, args.timeout - (time.perf_counter() - t0))):
            raise RuntimeError(
                f"{relay.name}: {tail.sent} of {tail.want} status=sent after {args.timeout} s"
                f" ({tail.problems} problems: {tail.first_problem})"
            )
        usage = tree.stop()
        sink_cpu = sum(_cpu(s.pid) for s in sinks) - sink_cpu0
        return Run(
            relay.name,
            shape,
            rnd,
            args.m,
            tail.last_sent - t0,
            usage,
            sink_cpu,
            source_cpu,
            tail.problems,
        )
    finally:
        if tail is not None:
            tail.stop.set()
        if source is not None and source.returncode is None:
            source.kill()
            source.wait(10)
        relay.stop()
        for sink in sinks:
            sink.kill()
            sink.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def _spread(values: Sequence[float], fmt: str = "{:.0f}") -> str:
    med = statistics.median(values)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def summary(runs: Sequence[Run], relays: Sequence[str]) -> list[str]:
    """Per shape: median (min-max) msg/s, CPU ms/msg, ratio of each qmgrd to Postfix per round."""
    ratio_heads = " | ".join(f"{r}/postfix" for r in relays if r != "postfix")
    heads = " | ".join(f"{r} msg/s  cpu ms/msg" for r in relays)
    out = ["", f"shape | {heads} | {ratio_heads}"]
    for shape in dict.fromkeys(run.shape for run in runs):
        cells = []
        for relay in relays:
            mine = [r for r in runs if r.shape == shape and r.relay == relay]
            if mine:
                cpu = [r.relay_cpu.total_cpu * 1000 / r.messages for r in mine]
                cells.append(f"{_spread([r.rate for r in mine])}  {_spread(cpu, '{:.2f}')}")
            else:
                cells.append("-")
        by_round = {(r.relay, r.round): r.rate for r in runs if r.shape == shape}
        ratio_cells = []
        for mine_name in (r for r in relays if r != "postfix"):
            ratios = [
                rate / by_round[("postfix", rnd)]
                for (relay, rnd), rate in by_round.items()
                if relay == mine_name and ("postfix", rnd) in by_round
            ]
            ratio_cells.append(_spread(ratios, "{:.2f}") if ratios else "-")
        out.append(f"{shape.label} | " + " | ".join(cells) + " | " + " | ".join(ratio_cells))
    return out


_RELAYS = ("qmgrd", "postfix", "floor", "floor-mem")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the rounds, print the lines and the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help="comma list of " + ", ".join(SHAPES)
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-m", type=int, default=3000, help="messages per run (smtp-source -m)")
    parser.add_argument("-s", type=int, default=20, help="parallel sessions (smtp-source -s)")
    parser.add_argument(
        "--relays",
        default="qmgrd,postfix",
        help="comma list of qmgrd, postfix, floor, floor-mem (the last two: bench/floorrelay.py)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument(
        "--smtpd-workers",
        default=None,
        help="qmgrd's smtpd_worker_processes, or a comma list to run each in every round "
        "(e.g. 0,2; default: qmgrd's own default)",
    )
    parser.add_argument(
        "--delivery-workers",
        default=None,
        help="qmgrd's delivery_worker_processes, or a comma list to run each in every round "
        "(e.g. 0,1, combined with each --smtpd-workers value; default: qmgrd's own default)",
    )
    parser.add_argument(
        "--qmgrd-main", action="append", default=[], metavar="LINE",
        help="an extra main.cf line for qmgrd (repeatable; bench/destdb.py --e2e uses it)",
    )
    args = parser.parse_args(argv)
    tools = {name: tool(name) for name in ("smtp-source", "smtp-sink", "postfix")}
    missing = [name for name in ("smtp-source", "smtp-sink") if not tools[name]]
    if missing:
        print(f"{' and '.join(missing)} not found: apt-get install postfix", file=sys.stderr)
        return 2
    names = [name for name in args.shapes.split(",") if name]
    relays = [name for name in args.relays.split(",") if name]
    if not names or any(name not in SHAPES for name in names):
        parser.error(f"--shapes: choose from {', '.join(SHAPES)}")
    if not relays or any(name not in _RELAYS for name in relays):
        parser.error(f"--relays: choose from {', '.join(_RELAYS)}")
    shapes = [SHAPES[name] for name in names]
    if "postfix" in relays and (not tools["postfix"] or os.geteuid() != 0):
        print("postfix: not installed or not root; running qmgrd only", file=sys.stderr)
        relays.remove("postfix")
    found = {k: v for k, v in tools.items() if v is not None}
    print(
        f"cpus={os.cpu_count()} loadavg={os.getloadavg()[0]:.1f} m={args.m} s={args.s} "
        f"rounds={args.rounds} relays={','.join(relays)} "
        f"smtpd_worker_processes={args.smtpd_workers or 'default'} "
        f"delivery_worker_processes={args.delivery_workers or 'default'} "
        f"source=smtp-source -s {args.s} -m {args.m} -l SIZE [-r RCPTS]",
        flush=True,
    )
    smtpd = [None] if args.smtpd_workers is None else args.smtpd_workers.split(",")
    delivery = [None] if args.delivery_workers is None else args.delivery_workers.split(",")
    variants = [(w, d) for w in smtpd for d in delivery]
    variant_names = [Qmgrd(w, (), d).name for w, d in variants]
    if "qmgrd" in relays:
        at = relays.index("qmgrd")
        relays[at : at + 1] = variant_names
    runs: list[Run] = []
    failed = 0
    for shape in shapes:
        for rnd in range(1, args.rounds + 1):
            for name in relays:
                if name == "postfix":
                    relay: Relay = Postfix(found["postfix"])
                elif name.startswith("floor"):
                    relay = Floor(durable=name == "floor")
                else:
                    w, d = variants[variant_names.index(name)]
                    relay = Qmgrd(w, args.qmgrd_main, d)
                try:
                    run = run_once(relay, shape, rnd, args, found)
                except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                    failed += 1
                    print(f"{shape.name:<9} round={rnd} {name:<7} FAILED: {exc}", flush=True)
                    continue
                runs.append(run)
                print(run.line(), flush=True)
    for line in summary(runs, relays):
        print(line)
    print(f"loadavg at end={os.getloadavg()[0]:.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
