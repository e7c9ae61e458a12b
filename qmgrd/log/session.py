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

    _counts: dict[str, list[int]] = field(default_factory=dict)

    def record(self, command: str, ok: bool) -> None:
        """One command answered: ``ok`` when its final reply was positive."""
        name = _NAMES.get(command)
        if name is None:
            name = command.lower()
            if name not in _KNOWN:
                name = "unknown"
        pair = self._counts.get(name)
        if pair is None:
            self._counts[name] = [1 if ok else 0, 1]
        else:
            pair[1] += 1
            if ok:
                pair[0] += 1

    def as_field(self) -> dict[str, tuple[int, int]]:
        """The ``commands`` field of the ``disconnect`` event: name → (ok, total)."""
        return {name: (ok, total) for name, (ok, total) in self._counts.items()}
