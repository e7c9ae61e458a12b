"""Offline qmgrd expire [-f]: the forced-expire mark, due times and release from hold."""

from __future__ import annotations

import io
import os

from qmgrd.ops.postsuper import operate_command
from qmgrd.spool import Envelope, RecipientSpec, Spool, is_forced_expire

NOW = 1_700_000_000.0


def _commit(spool: Spool, queue: str) -> str:
    qid = spool.commit(Envelope("s@x.test", (RecipientSpec("r@y.test"),), NOW - 100), b"x")
    if queue != "incoming":
        spool.move(qid, "incoming", queue, mtime=NOW + 3600)
    return qid


def _run(spool: Spool, args: list[str], *, release: bool = False) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = operate_command(
        spool.root, "expire", args, stdin=io.StringIO(), out=out, err=err, now=NOW,
        release=release,
    )
    return code, out.getvalue(), err.getvalue()


def _marked(spool: Spool, queue: str, qid: str) -> bool:
    return is_forced_expire(os.stat(spool.path(queue, qid)).st_mode)


def test_expire_marks_in_place_and_makes_deferred_due(spool: Spool) -> None:
    """Each message is marked where it is; a deferred one becomes due now; held stays held."""
    deferred, held, incoming = (_commit(spool, q) for q in ("deferred", "hold", "incoming"))
    assert _run(spool, ["ALL"]) == (0, "qmgrd: Expired: 3 messages\n", "")
    assert _marked(spool, "deferred", deferred) and _marked(spool, "hold", held)
    assert _marked(spool, "incoming", incoming)
    assert os.stat(spool.path("deferred", deferred)).st_mtime == NOW
    assert spool.list_ids("hold") == [held]


def test_expire_f_also_releases_from_hold(spool: Spool) -> None:
    """expire -f (postsuper -f): a held message is marked and released (deferred, due now)."""
    held, deferred = _commit(spool, "hold"), _commit(spool, "deferred")
    assert _run(spool, [held, deferred], release=True) == (
        0, "qmgrd: Expired: 2 messages\nqmgrd: Released from hold: 1 message\n", ""
    )
    assert spool.list_ids("hold") == []
    assert _marked(spool, "deferred", held) and _marked(spool, "deferred", deferred)
    assert os.stat(spool.path("deferred", held)).st_mtime == NOW


def test_expire_of_an_unknown_id_is_exit_1(spool: Spool) -> None:
    """An id in no queue is reported and the exit code is 1; nothing else changes."""
    code, out, err = _run(spool, ["AAAAAAAAAAAA"], release=True)
    assert (code, out) == (1, "qmgrd: Expired: 0 messages\n")
    assert err == "qmgrd: warning: AAAAAAAAAAAA: no such message\n"
