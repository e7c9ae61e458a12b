"""CPU and memory of a process tree from /proc, for benchmarks (Linux only, no psutil).

``Tree(root_pids)`` takes a baseline; a sampler thread (``start``/``stop``) walks
the tree every ``period`` seconds through ``/proc/<pid>/task/<tid>/children``,
remembering each process's name, CPU time and resident size. ``usage()`` then
gives:

- ``total_cpu``: exact CPU seconds of the tree since the baseline: the roots'
  own and reaped-children time (``utime stime cutime cstime``) plus the time of
  every live descendant (Postfix's master reaps its daemons, so the CPU of an
  ``smtpd`` that exited after ``max_use`` sessions is in the master's
  ``cutime``);
- ``by_name``: CPU seconds per process name as sampled; what a process used
  between its last sample and its exit is reported as ``exited``;
- ``peak_pss``: the largest sum of proportional set sizes (``Pss`` of
  ``smaps_rollup``: shared pages divided among the processes that map them, so
  forty Postfix daemons do not count libc forty times) seen by a sample;
  ``largest``: the largest VmHWM of one
  process, with its name.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One process at one moment."""

    pid: int
    name: str
    cpu: float  # own utime + stime, seconds
    reaped: float  # cutime + cstime of waited-for children, seconds
    pss: int  # bytes, proportional set size
    hwm: int  # bytes (peak resident size so far)


def sample(pid: int) -> ProcSample | None:
    """Read one process from /proc; None if it has gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat.rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICK
    reaped = (int(fields[13]) + int(fields[14])) / _TICK
    pss = hwm = 0
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        rollup = ""
    for line in rollup.splitlines():
        if line.startswith("Pss:"):
            pss = int(line.split()[1]) * 1024
            break
    return ProcSample(pid, name, cpu, reaped, pss, hwm)


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's list)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):  # gone (ESRCH while being read)
        return out
    for tid in tids:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out.extend(int(word) for word in text.split())
    return out


def descendants(roots: list[int]) -> list[int]:
    """``roots`` and every process below them (bounded by the pid space)."""
    seen: list[int] = []
    todo = list(roots)
    while todo and len(seen) < 100_000:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.append(pid)
        todo.extend(children(pid))
    return seen


@dataclass(slots=True)
class Usage:
    """What a tree used between the baseline and ``usage()``."""

    total_cpu: float
    by_name: dict[str, float]
    peak_pss: int
    largest: tuple[str, int]


@dataclass(slots=True)
class Tree:
    """Watch the process tree under ``roots`` (see the module docstring)."""

    roots: list[int]
    period: float = 0.05
    base: dict[int, ProcSample] = field(default_factory=dict)
    last: dict[int, ProcSample] = field(default_factory=dict)
    peak_pss: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def baseline(self) -> None:
        """Record where every process of the tree stands now."""
        self.base = {}
        for pid in descendants(self.roots):
            found = sample(pid)
            if found is not None:
                self.base[pid] = found
        self.last = dict(self.base)
        self.peak_pss = sum(s.pss for s in self.base.values())

    def _once(self) -> None:
        pss = 0
        for pid in descendants(self.roots):
            found = sample(pid)
            if found is not None:
                self.last[pid] = found
                pss += found.pss
        self.peak_pss = max(self.peak_pss, pss)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._once()

    def start(self) -> None:
        """Baseline, then sample in a thread until ``stop``."""
        self.baseline()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> Usage:
        """Take a last sample, stop the thread and return the usage since the baseline."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._once()
        return self.usage()

    def usage(self) -> Usage:
        """CPU since the baseline: exact total, per name as sampled, ``exited`` the rest."""
        live = set(descendants(self.roots))
        total = 0.0
        by_name: dict[str, float] = {}
        for pid, now in self.last.items():
            before = self.base.get(pid)
            used = now.cpu - (before.cpu if before else 0.0)
            by_name[now.name] = by_name.get(now.name, 0.0) + used
            if pid in self.roots:
                total += used + now.reaped - (before.reaped if before else 0.0)
            elif pid in live:
                total += used
        sampled = sum(by_name.values())
        if total - sampled > 0.0005:
            by_name["exited"] = total - sampled
        largest = max(((s.name, s.hwm) for s in self.last.values()), key=lambda x: x[1])
        return Usage(total, by_name, self.peak_pss, largest)
