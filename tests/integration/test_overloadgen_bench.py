"""bench/overloadgen.py's sessions still speak SMTP: accepted ones are queued, refused ones
are told apart (no timing asserted; each run is bounded by its own short duration)."""

from __future__ import annotations

from pathlib import Path

from bench.overloadgen import generate
from tests.support.listener import listening, loopback_settings


async def test_closed_loop_sessions_are_accepted_and_queued(tmp_path: Path) -> None:
    async with listening(tmp_path) as srv:
        counts = await generate(srv.port, "closed", 2, 0.3, 10)
        assert counts["accepted"] >= 2
        assert counts["sent"] == counts["accepted"]
        assert set(counts) == {"sent", "accepted", "accepted_ms"}
        assert len(srv.ids()) == counts["accepted"]


async def test_sessions_past_the_session_limit_count_as_refused(tmp_path: Path) -> None:
    async with listening(tmp_path, loopback_settings(session_limit=1)) as srv:
        await srv.chat()  # the one session allowed
        counts = await generate(srv.port, "open", 50, 0.2, 10)
        assert counts["sent"] >= 1
        assert counts == {"sent": counts["sent"], "refused": counts["sent"]}
        assert srv.ids() == []
