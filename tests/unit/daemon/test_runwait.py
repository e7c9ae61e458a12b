"""RunWait: the shares of each window the loop's thread ran and waited for a CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgrd.daemon.looplag import RunWait
from tests.support.clock import FakeClock


def test_shares_of_each_window_from_schedstat(tmp_path: Path) -> None:
    """Each take() answers the nanoseconds ran and waited since the last, over the wall time."""
    stat = tmp_path / "schedstat"
    stat.write_text("1000000000 500000000 10\n")
    clock = FakeClock(100.0)
    rw = RunWait(str(stat), clock=clock)
    assert rw.take() is None  # not started
    rw.start()
    try:
        stat.write_text("1200000000 800000000 20\n")
        clock.advance(1.0)
        assert rw.take() == pytest.approx((0.2, 0.3))
        assert rw.take() is None  # no wall time passed
        stat.write_text("1300000000 800000000 21\n")
        clock.advance(0.5)
        assert rw.take() == pytest.approx((0.2, 0.0))
    finally:
        rw.stop()
    assert rw.take() is None


def test_unknown_without_schedstat(tmp_path: Path) -> None:
    """No file (not Linux), or one that does not parse: None, never an error."""
    missing = RunWait(str(tmp_path / "absent"))
    missing.start()
    assert missing.take() is None
    bad = tmp_path / "bad"
    bad.write_text("nonsense\n")
    garbled = RunWait(str(bad))
    garbled.start()
    assert garbled.take() is None
    garbled.stop()


def test_the_real_schedstat_of_this_thread() -> None:
    """On Linux the calling thread's own numbers: shares between 0 and a little over 1."""
    if not Path("/proc/thread-self/schedstat").exists():
        pytest.skip("no schedstat here")
    rw = RunWait()
    rw.start()
    try:
        assert sum(range(100_000)) > 0  # some work between the two reads
        shares = rw.take()
        assert shares is not None
        ran, waited = shares
        assert 0 <= ran <= 1.5 and 0 <= waited <= 1.5
    finally:
        rw.stop()
