"""The sans-IO SMTP server protocol: framing, DATA, limits and the dialogue, without sockets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qmgrd.errors import InvariantError
from qmgrd.listener.protocol import (
    AuthLine,
    Closed,
    Command,
    Content,
    DataEnd,
    Dialogue,
    Event,
    LineTooLong,
    Mode,
    Phase,
    ServerProtocol,
)


def _drain(proto: ServerProtocol) -> list[Event]:
    """Every event available now (bounded: the buffer only shrinks)."""
    out: list[Event] = []
    for _ in range(100_000):
        event = proto.next_event()
        if event is None:
            return out
        out.append(event)
        if isinstance(event, Closed):
            return out
    raise AssertionError("next_event never returned None")


def _chunked(
    proto: ServerProtocol, wire: bytes, cuts: list[int], held: int | None = None
) -> tuple[bytes, list[Event]]:
    """DATA fed in pieces of the ``cuts`` sizes (in turn); (content, the events after it).

    With ``held``, the protocol never keeps more than that many bytes in DATA.
    """
    proto.start_data()
    got = bytearray()
    events: list[Event] = []
    pos = 0
    for i in range(len(wire)):  # bounded: each round feeds at least one byte
        if pos >= len(wire):
            break
        step = cuts[i % len(cuts)]
        proto.receive_data(wire[pos : pos + step])
        pos += step
        for event in _drain(proto):
            if isinstance(event, Content) and not events:
                got += event.data
            else:
                events.append(event)
        assert held is None or proto.buffered <= held or proto.mode is not Mode.DATA
    return bytes(got), events


def _data(proto: ServerProtocol, wire: bytes, step: int) -> tuple[bytes, list[Event]]:
    """Feed ``wire`` in ``step``-byte pieces in DATA mode; (content, non-content events)."""
    proto.start_data()
    content = bytearray()
    others: list[Event] = []
    for i in range(0, len(wire), step):
        proto.receive_data(wire[i : i + step])
        for event in _drain(proto):
            if isinstance(event, Content):
                assert not others, "content after the end of data"
                content += event.data
            else:
                others.append(event)
    return bytes(content), others


def test_pipelined_commands_come_out_one_at_a_time_in_order() -> None:
    """Commands sent in one chunk are returned in order, then None (need data)."""
    proto = ServerProtocol()
    proto.receive_data(b"EHLO c.test\r\nmail FROM:<a@b> SIZE=10\r\nRCPT TO:<r@d>\nNOOP")
    assert _drain(proto) == [
        Command("EHLO", "c.test"),
        Command("MAIL", "FROM:<a@b> SIZE=10"),
        Command("RCPT", "TO:<r@d>"),
    ]
    proto.receive_data(b"\r\n")
    assert _drain(proto) == [Command("NOOP", "")]


def test_rset_and_commands_after_data_are_read_from_the_same_chunk() -> None:
    """Bytes after the end-of-data marker are commands again (pipelined RSET, QUIT)."""
    proto = ServerProtocol()
    proto.start_data()
    proto.receive_data(b"hi\r\n.\r\nRSET\r\nQUIT\r\n")
    assert _drain(proto) == [
        Content(b"hi\r\n"),
        DataEnd(4),
        Command("RSET", ""),
        Command("QUIT", ""),
    ]
    assert proto.mode is Mode.COMMAND


@pytest.mark.parametrize(
    ("wire", "content"),
    [
        (b".\r\n", b""),
        (b"..\r\n.\r\n", b".\r\n"),
        (b"a\r\n..b\r\n...\r\n.\r\n", b"a\r\n.b\r\n..\r\n"),
        (b"a\n.b\r.c\r\n.\r\n", b"a\n.b\r.c\r\n"),  # no unstuffing after a bare LF or CR
        (b"x\n.\ny\r\n.\r\n", b"x\n.\ny\r\n"),  # bare-LF "." does not end DATA
        (b"x\r.\ry\r\n.\r\n", b"x\r.\ry\r\n"),
        (b"x\n.\r\ny\r\n.\r\n", b"x\n.\r\ny\r\n"),
        (b"x\r\n.\ny\r\n.\r\n", b"x\r\n\ny\r\n"),  # "." after CRLF is unstuffed, LF kept
        (b"nul\x00 \xff\r\n.\r\n", b"nul\x00 \xff\r\n"),
    ],
)
@pytest.mark.parametrize("step", [1, 2, 3, 7, 1 << 20])
def test_only_crlf_dot_crlf_ends_data_and_dots_are_unstuffed(
    wire: bytes, content: bytes, step: int
) -> None:
    """DATA ends at CRLF.CRLF only, unstuffs line-leading dots, whatever the chunking."""
    got, others = _data(ServerProtocol(), wire, step)
    assert got == content
    assert others == [DataEnd(len(content))]


@given(
    lines=st.lists(st.binary(max_size=20), max_size=30),
    cuts=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=20),
)
def test_random_messages_survive_stuffing_and_any_chunking(
    lines: list[bytes], cuts: list[int]
) -> None:
    """Any content, dot-stuffed and split anywhere, comes out exactly as it went in."""
    content = b"".join(line.replace(b"\r\n", b"\n") + b"\r\n" for line in lines)
    stuffed = content.replace(b"\r\n.", b"\r\n..")
    if stuffed.startswith(b"."):
        stuffed = b"." + stuffed
    wire = stuffed + b".\r\nNOOP\r\n"
    proto = ServerProtocol()
    got, events = _chunked(proto, wire, cuts)
    assert got == content
    assert events == [DataEnd(len(content)), Command("NOOP", "")]


def test_data_memory_is_bounded_by_what_was_just_received() -> None:
    """10 MB of DATA in 64 KiB pieces: the protocol holds nothing back between them.

    Each piece ends with CRLF and is handed on whole; the "." that follows in
    the last piece is read with the CRLF before it (the end marker).
    """
    proto = ServerProtocol()
    proto.start_data()
    piece = (b"x" * 78 + b"\r\n") * 819
    total = 0
    for _ in range(160):
        proto.receive_data(piece)
        for event in _drain(proto):
            assert isinstance(event, Content)
            total += len(event.data)
        assert proto.buffered == 0
    proto.receive_data(b".\r\n")
    last = _drain(proto)
    assert last == [Content(b""), DataEnd(160 * len(piece))]
    assert total == 160 * len(piece)


def test_overlong_line_is_discarded_as_it_arrives_and_the_session_goes_on() -> None:
    """A 30 MB line is one LineTooLong; the buffer stays small; the next command is read."""
    proto = ServerProtocol()
    proto.receive_data(b"MAIL FROM:<")
    for _ in range(30):
        proto.receive_data(b"z" * (1 << 20))
        assert _drain(proto) == []
        assert proto.buffered <= (1 << 20) + 4096
    proto.receive_data(b">\r\nNOOP " + b"n" * 5000 + b"\r\nNOOP\r\n")
    assert _drain(proto) == [LineTooLong(), LineTooLong(), Command("NOOP", "")]


def test_auth_lines_have_their_own_longer_limit_then_commands_resume() -> None:
    """After a 334 the next line is an AuthLine (up to 12288 octets), then commands again."""
    proto = ServerProtocol()
    proto.expect_auth_line()
    proto.receive_data(b"A" * 10_000 + b"\r\nNOOP\r\n")
    assert _drain(proto) == [AuthLine(b"A" * 10_000), Command("NOOP", "")]
    proto.expect_auth_line()
    proto.receive_data(b"B" * 13_000 + b"\r\nNOOP\r\n")
    assert _drain(proto) == [LineTooLong(), Command("NOOP", "")]


def test_end_of_stream_is_the_last_event_and_says_whether_data_was_cut() -> None:
    """Closed(in_data) follows the last complete event; a partial line is dropped."""
    proto = ServerProtocol()
    proto.receive_data(b"NOOP\r\nQUI")
    proto.receive_eof()
    assert _drain(proto) == [Command("NOOP", ""), Closed(in_data=False)]
    assert proto.next_event() == Closed(in_data=False)  # and so on: never "need data"
    proto = ServerProtocol()
    proto.start_data()
    proto.receive_data(b"partial\r\n")
    proto.receive_eof()
    assert _drain(proto) == [Content(b"partial\r\n"), Closed(in_data=True)]


def test_undecodable_bytes_in_commands_are_kept_with_surrogateescape() -> None:
    """A command argument with invalid UTF-8 keeps the bytes (as surrogates) for the checker."""
    proto = ServerProtocol()
    proto.receive_data(b"RCPT TO:<\xff@x>\r\n")
    (event,) = _drain(proto)
    assert isinstance(event, Command)
    assert event.arg.encode("utf-8", "surrogateescape") == b"TO:<\xff@x>"


def test_misuse_of_modes_is_a_bug() -> None:
    """start_data in DATA, expect_auth_line in DATA, data after eof: InvariantError."""
    proto = ServerProtocol()
    proto.start_data()
    with pytest.raises(InvariantError):
        proto.start_data()
    with pytest.raises(InvariantError):
        proto.expect_auth_line()
    proto.receive_eof()
    with pytest.raises(InvariantError):
        proto.receive_data(b"x")
    with pytest.raises(InvariantError):
        ServerProtocol(command_limit=100)


@pytest.mark.parametrize(
    ("phase", "verb", "reply"),
    [
        (Phase.GREETED, "MAIL", "503 5.5.1 Error: send HELO/EHLO first"),
        (Phase.GREETED, "RCPT", "503 5.5.1 Error: send HELO/EHLO first"),
        (Phase.GREETED, "DATA", "503 5.5.1 Error: send HELO/EHLO first"),
        (Phase.READY, "MAIL", None),
        (Phase.READY, "RCPT", "503 5.5.1 Error: need MAIL command"),
        (Phase.READY, "DATA", "503 5.5.1 Error: need RCPT command"),
        (Phase.MAIL, "MAIL", "503 5.5.1 Error: nested MAIL command"),
        (Phase.MAIL, "RCPT", None),
        (Phase.MAIL, "DATA", "554 5.5.1 Error: no valid recipients"),
        (Phase.MAIL, "AUTH", "503 5.5.1 Error: MAIL transaction in progress"),
        (Phase.RCPT, "RCPT", None),
        (Phase.RCPT, "DATA", None),
        (Phase.READY, "AUTH", None),
    ],
)
def test_commands_out_of_sequence_get_postfix_replies(
    phase: Phase, verb: str, reply: str | None
) -> None:
    """The dialogue answers a command out of sequence with Postfix's 503/554 text."""
    dialogue = Dialogue()
    dialogue.phase = phase
    assert dialogue.sequence_error(verb) == reply


def test_dialogue_moves_and_illegal_moves() -> None:
    """HELO, MAIL, RCPT, end, RSET move the phase; an illegal move raises InvariantError."""
    dialogue = Dialogue()
    with pytest.raises(InvariantError):
        dialogue.move("mail")
    dialogue.helo("c.test", extended=True)
    assert (dialogue.phase, dialogue.extended, dialogue.helo_name) == (Phase.READY, True, "c.test")
    dialogue.move("mail")
    assert dialogue.in_transaction
    with pytest.raises(InvariantError):
        dialogue.move("mail")
    dialogue.move("rcpt")
    dialogue.move("rcpt")
    dialogue.move("end")
    assert dialogue.phase is Phase.READY
    dialogue.move("mail")
    dialogue.move("reset")
    assert dialogue.phase is Phase.READY and not dialogue.in_transaction
    dialogue.helo("other", extended=False)
    assert (dialogue.extended, dialogue.helo_name) == (False, "other")


def test_data_chunks_without_a_stuffed_dot_are_handed_on_uncopied() -> None:
    """The common 100 KB case: each chunk is scanned once and handed on as the same object."""
    proto = ServerProtocol()
    proto.start_data()
    proto.receive_data(b"Subject: x\r\n\r\nfirst")  # the start: the stream's CRLF is prepended
    assert _drain(proto) == [Content(b"Subject: x\r\n\r\nfirst")]
    middle = b"line\r\n" * 10_000 + b"no line end yet"
    proto.receive_data(middle)
    (event,) = _drain(proto)
    assert isinstance(event, Content) and event.data is middle
    proto.receive_data(b"\r\n..dot\r\n.\r\nQUIT\r\n")
    assert _drain(proto) == [
        Content(b"\r\n.dot\r\n"),
        DataEnd(len(b"Subject: x\r\n\r\nfirst") + len(middle) + len(b"\r\n.dot\r\n")),
        Command("QUIT", ""),
    ]


def _reference(wire: bytes) -> tuple[bytes, bytes] | None:
    """RFC 5321 read naively over the whole stream: (content, bytes after) or None (no end)."""
    stream = b"\r\n" + wire
    end = stream.find(b"\r\n.\r\n")
    if end < 0:
        return None
    return stream[: end + 2].replace(b"\r\n.", b"\r\n")[2:], stream[end + 5 :]


@given(
    wire=st.lists(st.sampled_from([b"\r\n", b"\r", b"\n", b".", b"..", b"x", b"\r\n.\r\n"]))
    .map(b"".join),
    cuts=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=10),
)
def test_any_bytes_in_any_chunks_read_as_the_whole_stream_would(
    wire: bytes, cuts: list[int]
) -> None:
    """Chunking never changes where DATA ends, what is unstuffed or what follows."""
    proto = ServerProtocol()
    got, events = _chunked(proto, wire, cuts, held=2)
    expected = _reference(wire)
    if expected is None:  # no end yet: a prefix of the unstuffed stream, at most ".\r" held
        full = (b"\r\n" + wire).replace(b"\r\n.", b"\r\n")[2:]
        assert events == [] and proto.mode is Mode.DATA
        assert full.startswith(got) and len(full) - len(got) <= 2
    else:  # what follows the marker is read as commands, as if sent on its own
        content, rest = expected
        assert got == content
        after = ServerProtocol()
        after.receive_data(rest)
        assert events == [DataEnd(len(content)), *_drain(after)]
