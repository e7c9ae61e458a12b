"""The sans-IO SMTP client: bounded reply parsing, EHLO keywords and the MAIL/RCPT/DATA plan."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qmgrd.delivery.client import (
    Envelope,
    Reply,
    ReplyError,
    ReplyParser,
    Step,
    command_line,
    ehlo_extensions,
)
from qmgrd.errors import InvariantError


def _parse(*chunks: bytes, parser: ReplyParser | None = None) -> list[Reply]:
    parser = parser or ReplyParser()
    out: list[Reply] = []
    for chunk in chunks:
        parser.feed(chunk)
        while (reply := parser.next_reply()) is not None:
            out.append(reply)
    return out


def test_single_and_multiline_replies() -> None:
    """One-line and multi-line replies, CRLF or bare LF, and a bare code, become Reply values."""
    assert _parse(b"250 2.0.0 Ok\r\n250-mx\n250-PIPELINING\r\n250 SIZE 100\r\n354\r\n") == [
        Reply(250, "2.0.0 Ok"),
        Reply(250, "mx\nPIPELINING\nSIZE 100"),
        Reply(354, ""),
    ]


def test_incomplete_reply_waits_for_more() -> None:
    """Nothing is returned until a reply's last line has its LF."""
    parser = ReplyParser()
    assert _parse(b"250-a\r\n250 b", parser=parser) == []
    assert _parse(b"\r\n", parser=parser) == [Reply(250, "a\nb")]


def test_undecodable_text_is_kept() -> None:
    """Reply text that is not UTF-8 is kept byte for byte (surrogateescape), never an error."""
    (reply,) = _parse(b"550 \xff\xfe bad\r\n")
    assert reply.message.encode("utf-8", "surrogateescape") == b"\xff\xfe bad"


@pytest.mark.parametrize(
    "data",
    [b"HELLO I AM NOT SMTP\r\n", b"25 short\r\n", b"250x no separator\r\n", b"\r\n"],
)
def test_malformed_lines_are_errors(data: bytes) -> None:
    """A line without three digits and a space, dash or end is a protocol error."""
    with pytest.raises(ReplyError, match="malformed"):
        _parse(data)


def test_overlong_line_fails_before_its_end_arrives() -> None:
    """A line over the limit is an error as soon as the buffer passes it, LF or not."""
    parser = ReplyParser(line_limit=1000)
    parser.feed(b"250 " + b"x" * 996)
    assert parser.next_reply() is None  # exactly at the limit: still waiting
    parser.feed(b"x")
    with pytest.raises(ReplyError, match="longer than 1000 bytes"):
        parser.next_reply()
    assert parser.buffered == 0  # nothing of it is kept
    with pytest.raises(ReplyError):  # the error is final
        parser.next_reply()


def test_overlong_complete_line_is_an_error() -> None:
    """A complete line over the limit (LF in the same read) is an error too."""
    with pytest.raises(ReplyError, match="longer than"):
        _parse(b"550 " + b"u" * 100_000 + b"\r\n")


def test_endless_continuation_lines_stop_at_the_line_count_limit() -> None:
    """A reply that never ends is cut at ``line_count_limit`` lines, not held forever."""
    parser = ReplyParser(line_count_limit=5)
    parser.feed(b"250-x\r\n" * 4)
    assert parser.next_reply() is None
    parser.feed(b"250-x\r\n")
    with pytest.raises(ReplyError, match="longer than 5 lines"):
        parser.next_reply()


def test_limits_below_rfc_minimum_are_a_bug() -> None:
    """A line limit under RFC 5321's 512 octets is refused at construction."""
    with pytest.raises(InvariantError):
        ReplyParser(line_limit=100)


_REPLIES = st.lists(
    st.tuples(
        st.integers(min_value=200, max_value=599),
        st.lists(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
                 min_size=1, max_size=4),
    ),
    min_size=1,
    max_size=5,
)  # fmt: skip


def _render(replies: list[tuple[int, list[str]]], newline: bytes) -> bytes:
    out = b""
    for code, lines in replies:
        for n, text in enumerate(lines):
            sep = b" " if n == len(lines) - 1 else b"-"
            out += str(code).encode() + sep + text.encode() + newline
    return out


@given(_REPLIES, st.lists(st.integers(min_value=0, max_value=1000), max_size=10), st.booleans())
def test_any_split_gives_the_same_replies(
    replies: list[tuple[int, list[str]]], cuts: list[int], crlf: bool
) -> None:
    """However the bytes are split between reads, the same replies come out, in order."""
    data = _render(replies, b"\r\n" if crlf else b"\n")
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    expected = [Reply(code, "\n".join(lines)) for code, lines in replies]
    assert _parse(*chunks) == expected


@given(_REPLIES, st.lists(st.integers(min_value=0, max_value=1000), max_size=10))
def test_all_replies_at_once_equal_one_at_a_time(
    replies: list[tuple[int, list[str]]], cuts: list[int]
) -> None:
    """``replies(append)`` (one call per read) gives what ``next_reply`` gives, in order."""
    data = _render(replies, b"\r\n")
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    parser = ReplyParser()
    out: list[Reply] = []
    for chunk in chunks:
        parser.feed(chunk)
        parser.replies(out.append)
    assert out == _parse(*chunks)


def test_all_replies_at_once_hand_out_those_before_a_broken_one() -> None:
    """The replies before a broken line are handed out, then the error, then it again."""
    parser = ReplyParser()
    parser.feed(b"250 2.1.0 Ok\r\n250 2.1.5 Ok\r\nNOT SMTP\r\n354 go\r\n")
    out: list[Reply] = []
    with pytest.raises(ReplyError, match="malformed"):
        parser.replies(out.append)
    assert out == [Reply(250, "2.1.0 Ok"), Reply(250, "2.1.5 Ok")]
    with pytest.raises(ReplyError, match="malformed"):
        parser.replies(out.append)
    assert len(out) == 2


@given(st.lists(st.binary(max_size=3000), max_size=20))
def test_hostile_bytes_never_grow_the_buffer(chunks: list[bytes]) -> None:
    """Whatever a server sends, the parser yields replies or fails; its buffer stays bounded."""
    parser = ReplyParser(line_limit=1024)
    for chunk in chunks:
        parser.feed(chunk)
        try:
            while parser.next_reply() is not None:
                pass
        except ReplyError:
            return
        assert parser.buffered <= 1024


def test_ehlo_keywords_and_old_style_auth() -> None:
    """EHLO keywords are lower-cased with their parameters; AUTH= counts as AUTH."""
    reply = Reply(250, "mx.test Hello\nPIPELINING\nSIZE 1000\nAUTH PLAIN\nAUTH=LOGIN\n8BITMIME")
    assert ehlo_extensions(reply) == {
        "pipelining": "",
        "size": "1000",
        "auth": "PLAIN LOGIN",
        "8bitmime": "",
    }


def test_command_line_joins_words() -> None:
    """A command is its words joined by spaces, ended by CRLF."""
    assert command_line(b"MAIL", b"FROM:<a@b>", b"SIZE=10") == b"MAIL FROM:<a@b> SIZE=10\r\n"


# ----------------------------------------------------------------------------- envelope

MAIL = b"MAIL FROM:<s@x>\r\n"
RCPTS = [(0, b"RCPT TO:<a@x>\r\n"), (1, b"RCPT TO:<b@x>\r\n"), (2, b"RCPT TO:<c@x>\r\n")]
OK = Reply(250, "ok")


def _drive(envelope: Envelope, answers: dict[Step, list[Reply]]) -> list[bytes]:
    """Run the envelope against scripted answers per command; the writes it asked for."""
    writes: list[bytes] = []
    queues = {step: list(replies) for step, replies in answers.items()}
    for _ in range(20):
        out = envelope.to_send()
        if out is not None:
            writes.append(out)
        step = envelope.expected()
        if step is None:
            return writes
        envelope.receive(queues[step[0]].pop(0))
    raise AssertionError("envelope did not finish")


def test_pipelined_group_is_one_write_and_replies_match_in_order() -> None:
    """With PIPELINING: MAIL, every RCPT and DATA in one write; replies land per recipient."""
    env = Envelope(MAIL, list(RCPTS), pipelining=True)
    writes = _drive(
        env,
        {
            Step.MAIL: [OK],
            Step.RCPT: [OK, Reply(450, "busy"), Reply(550, "unknown")],
            Step.DATA: [Reply(354, "go")],
        },
    )
    assert writes == [MAIL + b"".join(line for _, line in RCPTS) + b"DATA\r\n"]
    assert env.rcpt_replies == {0: OK, 1: Reply(450, "busy"), 2: Reply(550, "unknown")}
    assert env.accepted == [0]
    assert env.data_reply == Reply(354, "go") and not env.data_unwanted


def test_probe_rset_heads_the_pipelined_group() -> None:
    """``probe``: RSET goes first in the same write and its reply is matched first."""
    env = Envelope(MAIL, list(RCPTS), pipelining=True, probe=True)
    assert env.to_send() == b"RSET\r\n" + MAIL + b"".join(line for _, line in RCPTS) + b"DATA\r\n"
    assert env.expected() == (Step.RSET, -1)
    assert env.receive(Reply(250, "reset")) == (Step.MAIL, -1)  # what expected() says next
    assert env.rset_reply == Reply(250, "reset") and env.expected() == (Step.MAIL, -1)
    with pytest.raises(InvariantError):  # without PIPELINING the probe is its own command
        Envelope(MAIL, list(RCPTS), pipelining=False, probe=True)


def test_without_pipelining_one_command_per_reply() -> None:
    """Without PIPELINING each command is written only after the previous reply."""
    env = Envelope(MAIL, list(RCPTS), pipelining=False)
    writes = _drive(env, {Step.MAIL: [OK], Step.RCPT: [OK, OK, OK], Step.DATA: [Reply(354, "go")]})
    assert writes == [MAIL, *(line for _, line in RCPTS), b"DATA\r\n"]
    assert env.accepted == [0, 1, 2]


def test_without_pipelining_refused_mail_stops_the_envelope() -> None:
    """A refused MAIL sends no RCPT; no accepted recipient sends no DATA."""
    env = Envelope(MAIL, list(RCPTS), pipelining=False)
    assert _drive(env, {Step.MAIL: [Reply(550, "no")]}) == [MAIL]
    assert not env.mail_ok and env.accepted == []
    env = Envelope(MAIL, list(RCPTS), pipelining=False)
    writes = _drive(env, {Step.MAIL: [OK], Step.RCPT: [Reply(550, "no")] * 3})
    assert b"DATA\r\n" not in writes and env.data_reply is None


def test_pipelined_refused_mail_reads_every_reply_and_ignores_them() -> None:
    """With PIPELINING after a refused MAIL the RCPT and DATA replies are read, none accepted."""
    env = Envelope(MAIL, list(RCPTS), pipelining=True)
    _drive(
        env,
        {
            Step.MAIL: [Reply(550, "no")],
            Step.RCPT: [OK] * 3,  # a server that accepts RCPT after refusing MAIL
            Step.DATA: [Reply(354, "go")],
        },
    )
    assert env.accepted == [] and env.data_unwanted


def test_envelope_invariants() -> None:
    """An envelope needs a recipient, and a reply with nothing outstanding is a bug."""
    with pytest.raises(InvariantError):
        Envelope(MAIL, [], pipelining=True)
    env = Envelope(MAIL, list(RCPTS), pipelining=False)
    with pytest.raises(InvariantError):
        env.receive(OK)
