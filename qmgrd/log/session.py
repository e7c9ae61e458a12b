"""Per-session SMTP command counts for the listener's ``disconnect`` line (Postfix 3.0+ smtpd).

The listener keeps one :class:`CommandCounts` per session, calls
:meth:`CommandCounts.record` once per command line it has answered, and
logs ``disconnect`` with ``commands=counts.as_field()``; the renderer
(:mod:`qmgrd.log.render`) orders and formats them as Postfix does:
``disconnect from unknown[127.0.0.1] ehlo=1 mail=1 rcpt=0/1 quit=1 commands=3/4``.

Postfix's rules, kept here: a command counts as given when its name is
recognised (anything else counts under ``unknown``), as successful when its
final reply was positive (2xx, or 3xx for DATA/AUTH continuations that then
succeeded: record the command once, with the outcome of the exchange).
Names are lower-case.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qmgrd.log.render import POSTFIX_COMMAND_ORDER

__all__ = ["CommandCounts"]

_KNOWN = frozenset(POSTFIX_COMMAND_ORDER)
# A verb as the protocol gives it (upper case) or as logged: its name, without a lower().
_NAMES = {name.upper(): name for name in POSTFIX_COMMAND_ORDER} | {n: n for n in _KNOWN}


@dataclass(slots=True, eq=False)
class CommandCounts:
    """Successful and total counts per command name, for one SMTP session."""

    _counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # name: (ok, total)

    def record(self, command: str, ok: bool) -> None:
        """One command answered: ``ok`` when its final reply was positive."""
        name = _NAMES.get(command)
        if name is None:
            name = command.lower()
            if name not in _KNOWN:
                name = "unknown"
        counts = self._counts
        pair = counts.get(name)
        if pair is None:
            counts[name] = (1, 1) if ok else (0, 1)
        else:
            counts[name] = (pair[0] + 1, pair[1] + 1) if ok else (pair[0], pair[1] + 1)

    def as_field(self) -> dict[str, tuple[int, int]]:
        """The ``commands`` field of the ``disconnect`` event: name → (ok, total)."""
        return dict(self._counts)  # a copy: the event keeps these counts
