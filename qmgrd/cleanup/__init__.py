"""Cleanup at intake: what Postfix's cleanup(8) does for a relay (DESIGN §10).

Public API
----------
``CleanupSettings.from_config(cfg)`` (`settings`): the parameters, tables opened once.

``HeaderProcessor(settings, MessageInfo(...))`` (`processor`): fed the message's
bytes in chunks with ``feed(data) -> bytes`` (write what it returns), then
``finish() -> bytes``; ``outcome`` (`Outcome`: `Disposition`, SMTP reply,
hold/discard reason, REDIRECT address, Message-ID). Bounded memory; never
raises for any input.

``rewrite_sender(settings, address)`` / ``rewrite_recipient(settings, address)``:
the envelope rewriting (qualification with myorigin, canonical maps,
masquerading), pure.

``decide(outcome) -> Decision`` (`intake`): what the SMTP listener does at the end
of DATA (store, hold, reply, REDIRECT recipients).

``Outbound`` (`outbound`): smtp_generic_maps / smtp_header_checks for the SMTP client.

``received_header``, ``message_id``, ``mail_date``, ``protocol_name`` (`trace`).
``HeaderChecks`` / ``open_header_checks`` (`checks`), also used on the way out.
"""

from __future__ import annotations

from qmgrd.cleanup.addresses import AddressRewriter, Role, map_address, rewrite_header_value
from qmgrd.cleanup.checks import Action, HeaderChecks, Verb, open_header_checks
from qmgrd.cleanup.intake import Decision, decide
from qmgrd.cleanup.processor import Disposition, HeaderProcessor, MessageInfo, Outcome
from qmgrd.cleanup.settings import CleanupSettings
from qmgrd.cleanup.trace import mail_date, message_id, protocol_name, received_header

__all__ = [
    "Action",
    "AddressRewriter",
    "CleanupSettings",
    "Decision",
    "Disposition",
    "HeaderChecks",
    "HeaderProcessor",
    "MessageInfo",
    "Outcome",
    "Role",
    "Verb",
    "decide",
    "mail_date",
    "map_address",
    "message_id",
    "open_header_checks",
    "protocol_name",
    "received_header",
    "rewrite_header_value",
    "rewrite_recipient",
    "rewrite_sender",
]


def rewrite_sender(settings: CleanupSettings, address: str) -> str:
    """The envelope sender after qualification, canonical maps and masquerading."""
    return settings.rewriter.envelope_sender(address)


def rewrite_recipient(settings: CleanupSettings, address: str) -> str:
    """An envelope recipient after qualification, canonical maps and masquerading."""
    return settings.rewriter.envelope_recipient(address)
