"""The standard benchmark runner still runs (a tiny qmgrd-only smoke run; no timing asserted).

Skipped when Postfix's smtp-source and smtp-sink are not installed (``apt-get
install postfix``); it never starts Postfix itself (``--relays qmgrd``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _have(name: str) -> bool:
    return bool(shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin"))


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    """bench/postfix_bench.py with ``args``, its output captured (bounded at 120 s)."""
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "postfix_bench.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(
    not (_have("smtp-source") and _have("smtp-sink")), reason="smtp-source/smtp-sink missing"
)
def test_postfix_bench_relays_every_recipient_and_prints_a_summary() -> None:
    """20 ten-recipient messages over ten sinks through qmgrd, in process and with two
    listener workers (``--smtpd-workers 0,2``), each without and with a delivery worker
    (``--delivery-workers 0,1``): one run line each, no problems."""
    proc = _bench(
        *("--shapes", "1k10r10d", "--rounds", "1", "-m", "20", "-s", "4", "--relays", "qmgrd"),
        *("--timeout", "60", "--smtpd-workers", "0,2", "--delivery-workers", "0,1"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = [line for line in proc.stdout.splitlines() if line.startswith("1k10r10d ")]
    assert len(runs) == 4, proc.stdout
    names = ("qmgrd-w0-d0", "qmgrd-w0-d1", "qmgrd-w2-d0", "qmgrd-w2-d1")
    for run, name in zip(runs, names, strict=True):
        assert re.search(rf"{name}\s+\d+ msg/s\s+\d+ rcpt/s", run), run
        assert re.search(r"cpu ms/msg: relay=[\d.]+ ", run), run
        assert "problems=0" in run
    assert "qmgrd-smtpd=" in runs[2] and "qmgrd-delivery" not in runs[2]  # workers' CPU apart
    assert "qmgrd-delivery=" in runs[1] and "qmgrd-smtpd" not in runs[1]
    assert any(
        line.startswith("1 KB, 10 recipients, 10 destinations |")
        for line in proc.stdout.splitlines()
    )


@pytest.mark.skipif(
    not (_have("smtp-source") and _have("smtp-sink")), reason="smtp-source/smtp-sink missing"
)
def test_the_floor_relays_relay_every_recipient_of_every_destination() -> None:
    """``--relays floor,floor-mem`` (bench/floorrelay.py, durable and in memory): 20
    ten-recipient messages over ten sinks, every recipient logged sent, no problems."""
    proc = _bench(
        *("--shapes", "1k10r10d", "--rounds", "1", "-m", "20", "-s", "4"),
        *("--relays", "floor,floor-mem", "--timeout", "60"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = [line for line in proc.stdout.splitlines() if line.startswith("1k10r10d ")]
    assert [run.split()[2] for run in runs] == ["floor", "floor-mem"], proc.stdout
    assert all("problems=0" in run for run in runs), proc.stdout


@pytest.mark.skipif(not _have("smtp-sink"), reason="smtp-sink missing")
def test_qmgr_drain_bench_drains_and_prints_the_queue_managers_cpu() -> None:
    """bench/qmgr_drain.py: 30 ten-recipient messages over ten sinks, drained; a line per run
    and a median line."""
    proc = subprocess.run(
        [
            *(sys.executable, str(REPO / "bench" / "qmgr_drain.py")),
            *("--shape", "1k10r10d", "-n", "30", "--rounds", "1", "--timeout", "60"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"round=1 +\d+ msg/s  qmgr cpu [\d.]+ ms/msg", proc.stdout), proc.stdout
    assert re.search(r"median \d+ msg/s .*qmgr cpu [\d.]+ ms/msg", proc.stdout), proc.stdout
