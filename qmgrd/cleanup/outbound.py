"""On the way out: ``smtp_generic_maps`` and ``smtp_header_checks`` (Postfix's smtp(8)).

Contract
--------
- `Outbound(generic_maps, header_checks, recipient_delimiter)` is the frozen
  per-transport configuration (built in ``SmtpSettings.from_transport``);
  ``active`` is False when neither is set, and the SMTP client then sends the
  queue file's bytes exactly as before.
- ``Outbound.address(a)`` rewrites one envelope address in generic(5) order
  (``user+ext@d``, ``user@d``, ``@d``; an ``@domain`` result keeps the local
  part; the extension is given back), once, not recursively (Postfix's
  smtp_map11_external). The null sender is never rewritten.
- ``Outbound.filter()`` returns an `OutboundFilter` for one delivery: a
  `HeaderStream` that rewrites the addresses of every sender and recipient
  header with the same maps and applies ``smtp_header_checks`` (``IGNORE``,
  ``REPLACE``, ``PREPEND``, ``WARN``, ``INFO``, ``DUNNO``/``OK``; the others
  are refused at start, as the message is already accepted). Bounded by
  ``header_size_limit``; the body passes untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qmgrd.cleanup.addresses import map_address, rewrite_header_value
from qmgrd.cleanup.checks import HeaderChecks, Verb
from qmgrd.cleanup.headers import HeaderClass, classify, header_name_length
from qmgrd.cleanup.stream import HeaderStream
from qmgrd.log import get_logger
from qmgrd.tables import LookupTable

_NO_CHECKS = HeaderChecks(())


@dataclass(frozen=True, slots=True)
class Outbound:
    """smtp_generic_maps and smtp_header_checks of one transport."""

    generic_maps: tuple[LookupTable, ...] = ()
    header_checks: HeaderChecks = _NO_CHECKS
    recipient_delimiter: str = ""
    header_size_limit: int = 102400

    @property
    def active(self) -> bool:
        """Whether the content must go through `filter` at all."""
        return bool(self.generic_maps) or bool(self.header_checks)

    def address(self, address: str) -> str:
        """The envelope address after generic mapping (unchanged without a match)."""
        if not self.generic_maps or not address:
            return address
        found = map_address(self.generic_maps, address, self.recipient_delimiter)
        return found if found else address

    def filter(self, queue_id: str = "") -> OutboundFilter:
        """A fresh header filter for one message."""
        return OutboundFilter(self, queue_id)


class OutboundFilter(HeaderStream):
    """The header pass of one delivery (module doc)."""

    __slots__ = ("_log", "_outbound", "_queue_id")

    def __init__(self, outbound: Outbound, queue_id: str, log: Any = None) -> None:
        super().__init__(outbound.header_size_limit)
        self._outbound = outbound
        self._queue_id = queue_id
        self._log = log if log is not None else get_logger("smtp")

    def _header(self, raw: bytes, truncated: bool) -> bytes:
        o = self._outbound
        name_len = header_name_length(raw)
        text = raw.decode("utf-8", "surrogateescape")
        prefix = b""
        if o.header_checks:
            key = text.rstrip("\r\n").replace("\r\n", "\n")
            action = o.header_checks.check(key)
            if action is not None:
                first = key.split("\n", 1)[0][:200]
                if action.verb is Verb.IGNORE:
                    return b""
                if action.verb is Verb.REPLACE:
                    self._log.info(
                        f"replace: header {first}: {action.text}", queue_id=self._queue_id
                    )
                    return self._encode_lines(action.text)
                if action.verb is Verb.PREPEND:
                    prefix = self._encode_lines(action.text)
                elif action.verb in (Verb.WARN, Verb.INFO):
                    word = "warning" if action.verb is Verb.WARN else "info"
                    self._log.info(
                        f"{word}: header {first}" + (f": {action.text}" if action.text else ""),
                        queue_id=self._queue_id,
                    )
        name = raw[:name_len].decode("ascii", "replace").lower()
        if (
            o.generic_maps
            and not truncated
            and classify(name) in (HeaderClass.SENDER, HeaderClass.RECIPIENT)
        ):
            colon = text.index(":", name_len)
            value = text[colon + 1 :]
            new = rewrite_header_value(value, o.address)
            if new != value:
                return prefix + (text[: colon + 1] + new).encode("utf-8", "surrogateescape")
        return prefix + raw
