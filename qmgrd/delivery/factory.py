"""Map a master.cf command name to a delivery agent (one agent per transport).

``create_agent("smtp", settings)`` returns a new ``SmtpAgent``;
``"discard"``, ``"error"`` and ``"retry"`` return the local agents. Any other
command is a configuration error naming it. ``"relay"`` is
accepted as an alias of ``smtp`` (Postfix's relay service is smtp(8)).
"""

from __future__ import annotations

import random

from qmgrd.delivery.agent import Agent
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.simple import DiscardAgent, ErrorAgent, RetryAgent
from qmgrd.delivery.smtp import SmtpAgent
from qmgrd.errors import ConfigError

AGENT_COMMANDS = frozenset({"smtp", "relay", "discard", "error", "retry"})


def agent_name(command: str) -> str:
    """The agent a master.cf command names: its first word ("" for an empty command)."""
    words = command.split()
    return words[0] if words else ""


def create_agent(
    command: str, settings: SmtpSettings | None = None, *, rng: random.Random | None = None
) -> Agent:
    """A new agent for a master.cf ``command``; ``settings`` default to Postfix's."""
    settings = settings or SmtpSettings()
    name = agent_name(command)
    if name in ("smtp", "relay"):
        return SmtpAgent(settings, rng=rng)
    if name == "discard":
        return DiscardAgent()
    if name == "error":
        return ErrorAgent(soft_bounce=settings.soft_bounce)
    if name == "retry":
        return RetryAgent()
    raise ConfigError(
        f"master.cf: unknown delivery agent command {command!r} "
        f"(expected one of {', '.join(sorted(AGENT_COMMANDS))})"
    )
