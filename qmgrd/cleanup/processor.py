"""`HeaderProcessor`: Postfix's cleanup(8) over a message's header section, streaming.

Theory of operation
-------------------
The caller (the listener while DATA streams into the queue file, or the
pickup) feeds the message's bytes in chunks of any size (dot-unstuffed, line
endings as received) with `feed`, writes what each call returns, and calls
`finish` at the end. The processor:

1. writes ``Received:`` first (Postfix's shape, `trace.received_header`);
2. cuts the header section into logical headers (a line and its continuation
   lines). One header is held at a time, at most ``header_size_limit`` bytes:
   the excess (of one long line or of many continuation lines) is dropped and
   the header is kept truncated, as Postfix's mime_state does
   (``MIME_ERR_TRUNC_HEADER``, logged). Memory is bounded by
   ``header_size_limit`` plus the chunk being fed, whatever the input;
3. for each header, in this order: counts ``Received:``/``Delivered-To:``
   against ``hopcount_limit``; applies ``header_checks`` (actions in
   `checks`); drops ``message_drop_headers``; for local clients rewrites the
   addresses of sender and recipient headers (`addresses`); a truncated
   header is never rewritten (it is passed as truncated, so a header is
   either wholly rewritten or left as it came);
4. ends the header section at the empty line, or at the first line that is
   neither a header nor a continuation (a name with 8-bit or control bytes,
   a line without a colon, a leading blank line): Postfix's is_header rule.
   Then, for local clients or with ``always_add_missing_headers``, appends
   the missing ``From:`` (from the envelope), ``Date:``, ``Message-ID:``
   (``<YYYYMMDDhhmmss.QUEUEID@myhostname>``) and the
   ``undisclosed_recipients_header`` when there is no To:/Cc:. When the
   section ended without an empty line, one is inserted before the line
   that ended it, so the receiver does not read that line as a header;
5. passes every body byte through untouched (no line splitting at all).

`outcome` tells what must happen to the message: accept, reject (with the
SMTP reply), hold, discard, bounce for too many hops; plus a REDIRECT address
and the Message-ID. It is final after `finish`; a REJECT is known as soon as
it happens (the listener may stop writing, but must read DATA to its end).
Nothing here raises for any input bytes.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

from qmgrd.cleanup.addresses import Role, rewrite_header_value
from qmgrd.cleanup.checks import Verb
from qmgrd.cleanup.headers import CLASSES as _CLASSES
from qmgrd.cleanup.headers import HeaderClass, header_name_length
from qmgrd.cleanup.settings import CleanupSettings
from qmgrd.cleanup.stream import HeaderStream
from qmgrd.cleanup.trace import message_id, received_header
from qmgrd.log import get_logger

_BLANKS = b" \t"
MESSAGE_ID_LOG_LIMIT = 998  # a logged Message-ID is cut at one RFC 5322 line
# A header value that is one address with a domain, bare or in <...> after a plain phrase
# (no quotes, comments, groups, folding or 8-bit bytes): rewriting that only qualifies
# addresses without a domain keeps it byte for byte (rewrite_header_value's result).
_ATOM = rb'[^\x00-\x20"(),:;<>@\[\\\]\x7f-\xff]+'
_QUALIFIED = re.compile(
    rb"[ \t]*(?:(?:" + _ATOM + rb"[ \t]+)*<" + _ATOM + b"@" + _ATOM + rb">|"
    + _ATOM + b"@" + _ATOM + rb")[ \t]*(?:\r?\n)?\Z"
)


class Disposition(enum.Enum):
    """What the caller does with the message after `finish`."""

    ACCEPT = "accept"
    REJECT = "reject"  # reply with Outcome.reply, store nothing
    HOLD = "hold"  # store into hold/
    DISCARD = "discard"  # report success, store nothing (log says discarded)
    TOO_MANY_HOPS = "hops"  # SMTP: reply Outcome.reply; pickup: bounce 5.4.0


# Not frozen (STYLE 5's exception for a hot value): one is built per message, and a frozen
# dataclass's __init__ pays an object.__setattr__ call per field (11 here). Nothing
# changes it after construction.
@dataclass(slots=True)
class MessageInfo:
    """What the processor needs to know about the message's envelope and client."""

    queue_id: str
    sender: str  # the envelope sender, already rewritten (rewrite_sender)
    recipients: tuple[str, ...]  # as the client gave them (for "for <rcpt>")
    now: float
    local: bool  # CleanupSettings.is_local_client(...)
    helo: str | None = None
    client_name: str | None = None
    client_addr: str | None = None  # None: local submission (pickup)
    protocol: str = "ESMTP"  # trace.protocol_name(...)
    uid: int | None = None  # pickup: the submitting user
    full_name: str = ""  # sendmail -F, for a missing From:


@dataclass(slots=True)
class Outcome:
    """The result of cleanup for one message."""

    disposition: Disposition = Disposition.ACCEPT
    reply: str = ""  # SMTP reply for REJECT / TOO_MANY_HOPS ("550 5.7.1 ...")
    reason: str = ""  # HOLD / DISCARD text for the log
    redirect: str | None = None  # REDIRECT: the only recipient
    message_id: str | None = None  # as found or added
    truncated_headers: int = 0
    warnings: list[str] = field(default_factory=list)


# Enum members read through their class cost a metaclass lookup each: read once here.
_ACCEPT, _REJECT, _DISCARD = Disposition.ACCEPT, Disposition.REJECT, Disposition.DISCARD
_HOP, _SENDER, _RECIPIENT = HeaderClass.HOP, HeaderClass.SENDER, HeaderClass.RECIPIENT
_OTHER = HeaderClass.OTHER


class HeaderProcessor(HeaderStream):
    """One message's header section (module doc); feed bytes, write what comes back."""

    __slots__ = ("_checks", "_hops", "_info", "_log", "_seen", "_settings", "outcome")

    def __init__(self, settings: CleanupSettings, info: MessageInfo, log: Any = None) -> None:
        self._settings = settings
        self._info = info
        self._log = log if log is not None else get_logger("cleanup")
        self._checks = bool(settings.header_checks)  # asked for every header
        super().__init__(settings.header_size_limit)
        self._seen: set[str] = set()
        self._hops = 0
        self.outcome = Outcome()

    # -- hooks -------------------------------------------------------------------------

    def _begin(self, out: bytearray) -> None:
        info, s = self._info, self._settings
        text = received_header(
            myhostname=s.myhostname,
            mail_name=s.mail_name,
            queue_id=info.queue_id,
            now=info.now,
            helo=info.helo,
            client_name=info.client_name,
            client_addr=info.client_addr,
            protocol=info.protocol,
            recipients=info.recipients,
            uid=info.uid,
            date=s.dates(info.now),
        )
        out += self._encode_lines(text)

    def _truncated(self) -> None:
        self.outcome.truncated_headers += 1
        self._log.warning(
            "warning: header_size_limit exceeded: header truncated",
            queue_id=self._info.queue_id,
        )

    def _done(self) -> None:
        self._log_message_id()

    def _header(self, raw: bytes, truncated: bool) -> bytes:
        s, outcome = self._settings, self.outcome
        # the stream measured the name when the header started (unless it was cut since)
        name_len = self._name_len if not truncated else header_name_length(raw)
        name = raw[:name_len].decode("ascii", "replace").lower()
        kind = _CLASSES.get(name, _OTHER)  # classify(name)
        self._seen.add(name)
        if kind is _HOP:
            self._hops += 1
            if self._hops >= s.hopcount_limit and outcome.disposition is _ACCEPT:
                outcome.disposition = Disposition.TOO_MANY_HOPS
                outcome.reply = "554 5.4.0 Error: too many hops"
                self._log.info(
                    f"reject: header {raw[:name_len].decode('ascii', 'replace')}: "
                    f"hopcount_limit {s.hopcount_limit} reached: "
                    "5.4.0 too many hops",
                    queue_id=self._info.queue_id,
                )
        checks = self._checks
        text = "" if name != "message-id" and not checks else _text(raw)
        if name == "message-id" and outcome.message_id is None:
            outcome.message_id = text[name_len:].split(":", 1)[-1].strip()[:MESSAGE_ID_LOG_LIMIT]
        prefix = b""
        if checks and outcome.disposition not in (_REJECT, _DISCARD):
            key = text.rstrip("\r\n").replace("\r\n", "\n")
            action = s.header_checks.check(key)
            if action is not None:
                replaced = self._act(action.verb, action.text, key)
                if replaced is not None:
                    if replaced == "":
                        return b""
                    if action.verb is Verb.PREPEND:
                        prefix = self._encode_lines(replaced)
                    else:
                        return self._encode_lines(replaced)
        if name in s.drop_headers:
            return prefix
        if self._info.local and not truncated and (kind is _SENDER or kind is _RECIPIENT):
            colon = raw.index(b":", name_len)  # the name and blanks are ASCII: same offset
            if s.rewriter._only_unqualified and _QUALIFIED.match(raw, colon + 1):
                return prefix + raw  # one address with a domain: rewriting keeps it
            text = text or _text(raw)
            role = Role.HEADER_SENDER if kind is _SENDER else Role.HEADER_RECIPIENT
            value = text[colon + 1 :]
            new_value = rewrite_header_value(value, lambda a: s.rewriter.rewrite(a, role))
            if new_value != value:
                return prefix + (text[: colon + 1] + new_value).encode("utf-8", "surrogateescape")
        return prefix + raw

    def _act(self, verb: Verb, text: str, header: str) -> str | None:
        """Apply one action; the replacement text ('' = drop the header) or None (keep)."""
        outcome = self.outcome
        first_line = header.split("\n", 1)[0][:200]
        info = self._info
        client = (
            f"{info.client_name or 'unknown'}[{info.client_addr}]"
            if info.client_addr is not None
            else "local"
        )
        context = (
            f"header {first_line} from {client}; from=<{info.sender}> "
            f"to=<{info.recipients[0] if info.recipients else ''}> proto={info.protocol}"
            + (f" helo=<{info.helo}>" if info.helo else "")
        )
        log = self._log
        qid = info.queue_id
        if verb is Verb.REJECT:
            code, rest = _dsn_split(text or "message content rejected", "5.7.1")
            outcome.disposition = Disposition.REJECT
            outcome.reply = f"{'450' if code.startswith('4') else '550'} {code} {rest}"
            log.info(f"reject: {context}: {code} {rest}", queue_id=qid)
            return None
        if verb in (Verb.WARN, Verb.INFO):
            word = "warning" if verb is Verb.WARN else "info"
            outcome.warnings.append(text)
            log.info(f"{word}: {context}" + (f": {text}" if text else ""), queue_id=qid)
            return None
        if verb is Verb.IGNORE:
            return ""
        if verb in (Verb.REPLACE, Verb.PREPEND):
            if verb is Verb.REPLACE:
                log.info(f"replace: {context}: {text}", queue_id=qid)
            return text
        if verb is Verb.HOLD:
            if outcome.disposition is Disposition.ACCEPT:
                outcome.disposition = Disposition.HOLD
                outcome.reason = text
            log.info(f"hold: {context}" + (f": {text}" if text else ""), queue_id=qid)
            return None
        if verb is Verb.DISCARD:
            outcome.disposition = Disposition.DISCARD
            outcome.reason = text
            log.info(f"discard: {context}" + (f": {text}" if text else ""), queue_id=qid)
            return None
        if verb is Verb.REDIRECT:
            outcome.redirect = text
            log.info(f"redirect: {context}: {text}", queue_id=qid)
            return None
        return None

    def _end(self, out: bytearray) -> None:
        """Append the missing headers."""
        s, info = self._settings, self._info
        if info.local or s.always_add_missing_headers:
            seen = self._seen
            if "from" not in seen:
                sender = info.sender or "MAILER-DAEMON"
                value = f"{info.full_name} <{sender}>" if info.full_name else sender
                out += self._encode_lines(f"From: {value}")
            if "date" not in seen:
                out += self._encode_lines(f"Date: {s.dates(info.now)}")
            if "message-id" not in seen:
                mid = message_id(info.now, info.queue_id, s.myhostname)
                out += self._encode_lines(f"Message-Id: {mid}")
                self.outcome.message_id = mid
            if s.undisclosed_recipients_header and not seen & {
                "to",
                "cc",
                "resent-to",
                "resent-cc",
            }:
                out += self._encode_lines(s.undisclosed_recipients_header)

    def _log_message_id(self) -> None:
        mid = self.outcome.message_id
        if mid is not None and self.outcome.disposition not in (
            Disposition.REJECT,
            Disposition.TOO_MANY_HOPS,
        ):
            self._log.info("cleanup", queue_id=self._info.queue_id, message_id=mid)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _dsn_split(text: str, default: str) -> tuple[str, str]:
    """``"4.7.1 go away"`` -> ("4.7.1", "go away"); without a code, the default."""
    word, _, rest = text.partition(" ")
    parts = word.split(".")
    if len(parts) == 3 and parts[0] in ("4", "5") and all(p.isdigit() for p in parts):
        return word, rest.strip() or "message content rejected"
    return default, text
