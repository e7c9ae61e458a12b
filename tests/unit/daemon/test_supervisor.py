"""TaskSupervisor: tasks started on the running loop, loop after loop; bugs reported."""

from __future__ import annotations

import asyncio

from qmgrd.daemon.supervisor import TaskSupervisor


def test_tasks_run_on_each_loop_the_supervisor_is_used_on() -> None:
    """The loop is looked up once, not at every spawn: a supervisor used again on a new
    loop (an engine run again; the first loop closed) starts its tasks on the new one."""
    done: list[int] = []
    bugs: list[BaseException] = []
    sup = TaskSupervisor(lambda: done.append(1), bugs.append)
    ran: list[asyncio.AbstractEventLoop] = []

    async def job() -> None:
        ran.append(asyncio.get_running_loop())

    async def failing() -> None:
        raise ValueError("a bug")

    async def once(*, fail: bool) -> asyncio.AbstractEventLoop:
        sup.spawn(job(), delivery=True)
        if fail:
            sup.spawn(failing())
        assert sup.busy
        await sup.shutdown(5.0, None)
        return asyncio.get_running_loop()

    loops = [asyncio.run(once(fail=False)), asyncio.run(once(fail=True))]
    assert ran == loops and loops[0] is not loops[1]
    assert not sup.busy
    assert len(done) == 3
    assert [str(b) for b in bugs] == ["a bug"]
