"""The ``local`` destination state: rate syntax, GCRA, fallback shares; the gate's settings."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from qmgrd.config import load_config
from qmgrd.daemon.destgate import GateSettings
from qmgrd.destdb import DestKey, Limits, Rate, Verdict, parse_rate
from qmgrd.destdb.local import LocalState
from qmgrd.errors import ConfigError
from qmgrd.ops.check import run_checks
from tests.support.clock import FakeClock
from tests.support.config import write_config

KEY = DestKey("smtp", "dst.test")


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("600/1m", Rate(600, 60.0)),
        ("10/s", Rate(10, 1.0)),
        (" 5 / 30s ", Rate(5, 30.0)),
        ("", None),
        ("0", None),
        ("0/1m", None),
        ("600/1m,max_burst=30", Rate(600, 60.0, 30)),
        ("10/s, max_burst = 2", Rate(10, 1.0, 2)),
    ],
)
def test_parse_rate(text: str, rate: Rate | None) -> None:
    """N/period with Postfix time units; empty or 0 means no limit."""
    assert parse_rate(text) == rate


@pytest.mark.parametrize(
    "text", ["600", "x/1m", "10/0s", "10/1y", "-1/1m", "10/s,max_burst=0", "10/s,burst=3"]
)
def test_parse_rate_rejects(text: str) -> None:
    """Anything else is an error naming the value."""
    with pytest.raises(ValueError, match="bad rate"):
        parse_rate(text)


async def test_local_rate_limit_spaces_deliveries() -> None:
    """10/s on the local backend: over 2 s of the (fake) clock, asking again when told, 20
    admissions, each at least 100 ms after the previous one."""
    clock = FakeClock(0.0)
    state = LocalState(clock.now)
    limits = Limits(rate=Rate(10, 1.0))
    granted: list[float] = []
    for _ in range(200):  # bounded; the clock runs out first
        if clock.now() >= 2.0:
            break
        adm = await state.admit(KEY, limits)
        if adm.lease is not None:
            granted.append(clock.now())
            await state.release(adm.lease, ok=True)
            clock.advance(0.03)
        else:
            assert adm.verdict is Verdict.RATE and 0 < adm.retry_after <= 0.1
            clock.advance(adm.retry_after)
    assert len(granted) == 20
    gaps = [b - a for a, b in itertools.pairwise(granted)]
    assert min(gaps) == pytest.approx(0.1)


async def test_local_rate_burst() -> None:
    """10/s with max_burst=4: four at once, then one every 100 ms (GCRA's tolerance)."""
    clock = FakeClock(0.0)
    state = LocalState(clock.now)
    limits = Limits(rate=Rate(10, 1.0, burst=4))
    verdicts = [(await state.admit(KEY, limits)).verdict for _ in range(5)]
    assert verdicts == [Verdict.OK] * 4 + [Verdict.RATE]
    clock.advance(0.1)
    assert (await state.admit(KEY, limits)).verdict is Verdict.OK
    assert (await state.admit(KEY, limits)).verdict is Verdict.RATE


async def test_fallback_share_of_cap_and_rate() -> None:
    """Share 0.34: 1 of a cap of 5 (at least 1), a third of the rate."""
    clock = FakeClock(0.0)
    state = LocalState(clock.now, share=0.34)
    adm = await state.admit(KEY, Limits(cap=5, rate=Rate(3, 1.0)))
    assert adm.verdict is Verdict.OK
    assert (await state.admit(KEY, Limits(cap=5))).verdict is Verdict.FULL
    assert adm.lease is not None
    await state.release(adm.lease, ok=True)
    clock.advance(0.5)
    again = await state.admit(KEY, Limits(cap=5, rate=Rate(3, 1.0)))
    assert again.verdict is Verdict.RATE  # 3/s * 0.34 ~ one per 0.98 s
    assert state.held() == 0


def test_gate_settings_read_the_cluster_parameters(tmp_path: Path) -> None:
    """The backend, timeouts, share and each transport's rate limit come from main.cf."""
    conf = write_config(
        tmp_path,
        "destination_state_backend = redis://127.0.0.1:6390/2\n"
        "destination_state_password = s3cret\n"
        "destination_state_timeout = 2s\n"
        "destination_state_lease_ttl = 9s\n"
        "destination_state_fallback_percent = 25\n"
        "smtp_destination_rate_limit = 600/1m\n",
    )
    settings = GateSettings.from_config(load_config(conf, hostname="mx.test"), ("smtp", "relay"))
    assert settings.backend == "redis://127.0.0.1:6390/2"
    assert (settings.password, settings.timeout, settings.lease_ttl) == ("s3cret", 2.0, 9.0)
    assert settings.fallback_share == 0.25
    assert settings.rates == {"smtp": Rate(600, 60.0), "relay": None}


@pytest.mark.parametrize(
    ("line", "name"),
    [
        ("destination_state_backend = memcached://x", "destination_state_backend"),
        ("relay_destination_rate_limit = lots", "relay_destination_rate_limit"),
    ],
)
def test_gate_settings_reject_bad_values(tmp_path: Path, line: str, name: str) -> None:
    """A bad backend or rate is a ConfigError naming the parameter."""
    conf = write_config(tmp_path, line + "\n")
    with pytest.raises(ConfigError, match=name):
        GateSettings.from_config(load_config(conf, hostname="mx.test"), ("smtp", "relay"))


def test_qmgrd_check_reports_a_bad_rate(tmp_path: Path) -> None:
    """``qmgrd check`` names a bad ``<transport>_destination_rate_limit`` before any start."""
    conf = write_config(tmp_path, "smtp_destination_rate_limit = fast\n")
    found = run_checks(conf)
    assert any("smtp_destination_rate_limit" in line for line in found.errors)
