"""Metrics: reject classes, the oldest message's age per queue, build info, labels never empty."""

from __future__ import annotations

import asyncio
import platform
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from qmgrd import __version__
from qmgrd.daemon.metrics import Metrics, spool_oldest_ages
from qmgrd.daemon.metrics_intake import reject_reason
from qmgrd.delivery.agent import Outcome
from qmgrd.errors import InvariantError
from qmgrd.ops.operation import Operation
from qmgrd.spool import Envelope, RecipientSpec, Spool, queue_id_time
from tests.support.agents import FakeAgent
from tests.support.engine import create_test_engine, run_until_idle, stop_engine, submit


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("554 5.7.1 <r@dst.test>: Relay access denied", "relay_denied"),
        ("552 5.3.4 Message size exceeds fixed limit", "size"),
        ("452 4.5.3 Error: too many recipients", "too_many_recipients"),
        ("451 4.3.0 Error: queue file write error", "storage"),
        ("452 4.3.1 Insufficient system storage", "storage"),
        ("501 5.1.7 Bad sender address syntax", "syntax"),
        ("500 5.5.2 Error: command not recognized", "syntax"),
        ("503 5.5.1 Error: need MAIL command", "syntax"),
        ("553 5.6.7 Must declare SMTPUTF8 to send unicode address", "syntax"),
        ("421 4.7.0 mx.test Error: too many errors", "limits"),
        ("421 4.4.2 mx.test Error: timeout exceeded", "limits"),
        ("450 4.7.1 Error: too many AUTH commands from 127.0.0.1", "limits"),
        ("454 4.7.0 Temporary authentication failure", "other"),
        ("535 5.7.8 Error: authentication failed: authentication failure", None),
        ("250 2.0.0 Ok", None),
        ("354 End data with <CR><LF>.<CR><LF>", None),
        ("554-first line of two", None),
        ("", None),
    ],
)
def test_reject_reason(reply: str, reason: str | None) -> None:
    """Every refusal the listener sends has a class; successes and AUTH's 535 have none."""
    assert reject_reason(reply) == reason


def test_oldest_age_per_queue_from_the_ids(tmp_path: Path) -> None:
    """The age comes from the oldest id of each queue; empty queues report 0."""
    spool = Spool(tmp_path / "spool", fsync=False)
    spool.ensure_dirs()
    env = Envelope("s@x.test", (RecipientSpec("r@y.test"),), 1_700_000_000.0)
    first = spool.commit(env, b"x")
    second = spool.commit(env, b"x")
    spool.move(first, "incoming", "deferred")
    spool.move(second, "incoming", "deferred")
    born = min(queue_id_time(first), queue_id_time(second))
    ages = spool_oldest_ages(spool, born + 3600)
    assert ages["deferred"] == pytest.approx(3600, abs=0.01)
    assert ages["incoming"] == ages["active"] == ages["hold"] == 0.0
    assert spool_oldest_ages(spool, born - 10)["deferred"] == 0.0  # clock behind: never < 0


def test_scrape_has_oldest_age_and_build_info() -> None:
    """The ages function is read at scrape time; build info names qmgrd's and Python's version."""
    metrics = Metrics(queue_ages_fn=lambda: {"deferred": 7200.0, "incoming": 0.0})
    families = {f.name: f for f in text_string_to_metric_families(metrics.generate().decode())}
    oldest = {s.labels["queue"]: s.value for s in families[
        "qmgrd_queue_oldest_message_age_seconds"].samples}
    assert oldest == {"deferred": 7200.0, "incoming": 0.0}
    [build] = families["qmgrd_build_info"].samples
    assert build.labels == {"version": __version__, "python": platform.python_version()}
    assert build.value == 1


def test_an_empty_transport_label_is_a_bug() -> None:
    """record_delivery refuses an empty transport label instead of serving it."""
    with pytest.raises(InvariantError, match="empty transport"):
        Metrics().record_delivery("", "expired", "4.4.1", 1.0)


async def test_expired_deliveries_carry_their_transport(tmp_path: Path) -> None:
    """A recipient returned by expiry is counted under the transport it was routed to."""
    agent = FakeAgent(rule=lambda _a: (Outcome.DEFERRED, "4.2.0", "450 later"))
    engine, spool, clock = create_test_engine(tmp_path, agent)
    metrics = Metrics()
    engine.metrics = metrics
    qid = submit(spool, clock, "s@src.test", ["r@a.test"])
    task = await run_until_idle(engine)
    assert await engine.operate(Operation.EXPIRE, [qid]) == {qid: "ok"}
    await asyncio.wait_for(engine.wait_idle(), 20)
    await stop_engine(engine, task)
    value = metrics.registry.get_sample_value(
        "qmgrd_deliveries_total", {"transport": "smtp", "status": "expired"}
    )
    assert value == 1
    text = metrics.generate().decode()
    assert 'transport=""' not in text

