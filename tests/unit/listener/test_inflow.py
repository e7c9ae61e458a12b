"""The listener's intake gate: in_flow_delay tokens from a pipe, 421 4.3.2 when overloaded."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from qmgrd.listener.inflow import OPEN_GATE, TokenGate
from tests.support.clock import FakeClock


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """A token pipe: (read end, write end)."""
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


async def test_open_gate_admits_everything_at_once() -> None:
    """A listener nobody regulates never pauses and never refuses."""
    assert OPEN_GATE.admit_session()
    assert await OPEN_GATE.admit_message()


async def test_a_token_in_the_pipe_admits_at_once_and_is_taken(pipe: tuple[int, int]) -> None:
    """One message takes one token; with tokens there is no pause."""
    r, w = pipe
    os.write(w, b"tt")
    gate = TokenGate(r, delay=10)
    assert await gate.admit_message()
    assert await gate.admit_message()
    assert gate.paused == 0
    with pytest.raises(BlockingIOError):
        os.read(r, 1)  # both tokens were consumed


async def test_without_tokens_messages_wait_and_the_oldest_is_woken_first(
    pipe: tuple[int, int],
) -> None:
    """An empty pipe pauses MAIL; each token written wakes one waiter, oldest first."""
    r, w = pipe
    gate = TokenGate(r, delay=30)
    order: list[int] = []

    async def message(n: int) -> None:
        assert await gate.admit_message()
        order.append(n)

    tasks = [asyncio.create_task(message(n)) for n in range(3)]
    for _ in range(3):
        await asyncio.sleep(0)
    assert order == [] and gate.paused == 3
    os.write(w, b"t")
    await asyncio.wait_for(asyncio.shield(tasks[0]), 20)
    assert order == [0]
    os.write(w, b"tt")
    await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert order == [0, 1, 2] and gate.timeouts == 0
    gate.close()


async def test_without_tokens_a_message_goes_on_after_in_flow_delay(
    pipe: tuple[int, int],
) -> None:
    """As Postfix: no token within in_flow_delay, the message is accepted anyway."""
    r, _w = pipe
    gate = TokenGate(r, delay=0.01)
    assert await asyncio.wait_for(gate.admit_message(), 20)
    assert (gate.paused, gate.timeouts) == (1, 1)
    gate.close()


async def test_zero_delay_never_pauses(pipe: tuple[int, int]) -> None:
    """in_flow_delay = 0 turns pacing off: an empty pipe does not matter."""
    r, _w = pipe
    gate = TokenGate(r, delay=0)
    assert await gate.admit_message()
    assert gate.paused == 0


async def test_overloaded_refuses_sessions_and_messages(pipe: tuple[int, int]) -> None:
    """Over capacity: both questions answer no (the listener replies 421 4.3.2)."""
    r, w = pipe
    os.write(w, b"t")
    over = [True]
    gate = TokenGate(r, delay=10, overloaded=lambda: over[0])
    assert not gate.admit_session()
    assert not await gate.admit_message()
    assert gate.refused == 2
    over[0] = False
    assert gate.admit_session()
    assert await gate.admit_message()


def test_refusals_are_logged_at_most_once_a_second(pipe: tuple[int, int]) -> None:
    """``note_refusals`` reports the count since the last line, then nothing for a second."""
    r, _w = pipe
    clock = FakeClock(0.0)
    gate = TokenGate(r, delay=1, overloaded=lambda: True, clock=clock)
    assert gate.note_refusals() == 0  # nothing refused yet
    assert not gate.admit_session()
    assert gate.note_refusals() == 1
    for _ in range(5):
        assert not gate.admit_session()
    assert gate.note_refusals() == 0  # within the second
    clock.advance(1.0)
    assert gate.note_refusals() == 5
