"""Flows: which fairness flow a message belongs to, from its envelope and the settings.

Contract
--------
- :func:`fairness_settings` builds the frozen :class:`FairnessSettings` from a loaded
  ``Config``: ``default_fairness_key`` (qmgrd only; Postfix has no such parameter), its
  per-transport override ``<transport>_fairness_key`` (main.cf or master.cf ``-o``), and the
  ``fairness_weight_maps`` tables, opened here. A weight value that does not parse is a
  ``ConfigError`` naming the setting, the table file and its line (``texthash``, ``hash``,
  ``lmdb`` source files, ``inline:`` and ``static:`` values are checked at load; the values of
  pattern tables, ``regexp``/``pcre``/``cidr``, are checked when they match: a bad one is
  logged through ``warn`` and weight 1 is used, so a table edited while running can never stop
  delivery).
- :func:`flow_of` computes a message's :class:`~qmgrd.core.flow.Flow` for a transport (or for
  the default key when ``transport`` is None, as admission into the active queue does, before
  recipients are resolved). Key kinds and the value they take from the envelope:

  ==================  ===============================================  ======================
  kind                value                                            when missing
  ==================  ===============================================  ======================
  ``none``            (no flow: ``FLOW_NONE``, Postfix's schedules)     --
  ``sender_domain``   the sender's domain, lower case                   ``<>`` (null sender)
  ``sender``          the sender address, lower case                    ``<>`` (null sender)
  ``sasl_username``   the AUTH identity of the submitting session      ``<unauthenticated>``
  ``client_address``  the SMTP client's IP address                      ``<local>`` (pickup,
                                                                         notices)
  ==================  ===============================================  ======================

  The flow key is ``kind:value``. ``fairness_weight_maps`` is searched with the whole key
  first, then with the bare value (so a ``cidr:`` table matches client addresses and a plain
  table may list ``example.org``); the first table with an answer wins. Its value is
  ``WEIGHT [TENANT]``: WEIGHT a positive number (at most 1000), TENANT a name of letters,
  digits, ``.``, ``_`` and ``-``. Keys mapped to the same tenant are one flow (key
  ``tenant:NAME``) and share its weight.
- :func:`transport_flows` gives the flows of the transports whose key differs from the
  default (usually none: an empty mapping, nothing allocated).

Flow computation is pure apart from table lookups (which never do I/O on the caller's behalf
beyond a table's own change check) and never raises for envelope contents.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from qmgrd.config import Config
from qmgrd.config.maps import open_maps, setting_where
from qmgrd.core.flow import FLOW_NONE, Flow
from qmgrd.errors import ConfigError
from qmgrd.tables import LookupTable
from qmgrd.tables.base import read_table_file, resolve_path, table_lines
from qmgrd.tables.simple import inline_body, split_braced

__all__ = [
    "KEY_KINDS",
    "FairnessSettings",
    "FlowEnvelope",
    "WeightTable",
    "fairness_settings",
    "flow_key",
    "flow_of",
    "parse_weight",
    "transport_flows",
]

KEY_KINDS = ("none", "sender_domain", "sender", "sasl_username", "client_address")
MAX_WEIGHT = 1000.0
_TENANT = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
_NO_FLOWS: Mapping[str, Flow] = MappingProxyType({})
_NO_KEYS: Mapping[str, str] = MappingProxyType({})
_WARNED_LIMIT = 100  # distinct bad values logged per table set; more are used silently as 1


class FlowEnvelope(Protocol):
    """What a flow is computed from: a ``QueueFile`` or an ``Envelope`` both qualify."""

    @property
    def sender(self) -> str: ...

    @property
    def client_addr(self) -> str | None: ...

    @property
    def sasl_username(self) -> str | None: ...


def parse_weight(value: str) -> tuple[float, str]:
    """``WEIGHT [TENANT]`` -> (weight, tenant or ""); ValueError saying what is wrong."""
    parts = value.split()
    if not parts or len(parts) > 2:
        raise ValueError(f"expected 'WEIGHT [TENANT]', got {value!r}")
    try:
        weight = float(parts[0])
    except ValueError:
        raise ValueError(f"weight {parts[0]!r} is not a number") from None
    if not (math.isfinite(weight) and 0.0 < weight <= MAX_WEIGHT):
        raise ValueError(f"weight {parts[0]!r} is not in (0, {MAX_WEIGHT:g}]")
    tenant = parts[1] if len(parts) == 2 else ""
    if tenant and not _TENANT.match(tenant):
        raise ValueError(f"tenant {tenant!r} is not a name of letters, digits, '.', '_', '-'")
    return weight, tenant


@dataclass(slots=True, eq=False)
class WeightTable:
    """The ``fairness_weight_maps`` tables as one lookup (first table with an answer wins)."""

    tables: tuple[LookupTable, ...]
    warn: Callable[[str], None] = lambda _text: None
    _warned: set[str] = field(default_factory=set)

    def find(self, key: str, bare: str) -> tuple[float, str] | None:
        """(weight, tenant) for flow ``key`` (or its ``bare`` value), None without an entry."""
        for table in self.tables:
            value = table.lookup(key)
            if value is None and bare:
                value = table.lookup(bare)
            if value is None:
                continue
            try:
                return parse_weight(value)
            except ValueError as exc:
                if value not in self._warned and len(self._warned) < _WARNED_LIMIT:
                    self._warned.add(value)
                    self.warn(
                        f"fairness_weight_maps: {getattr(table, 'spec', '?')}: key {key!r}: "
                        f"{exc}; using weight 1"
                    )
                return None
        return None


@dataclass(frozen=True, slots=True)
class FairnessSettings:
    """The fairness configuration the engine computes flows with."""

    default_key: str = "none"
    transport_keys: Mapping[str, str] = field(default_factory=lambda: _NO_KEYS)
    weights: WeightTable | None = None

    def __post_init__(self) -> None:
        for kind in (self.default_key, *self.transport_keys.values()):
            if kind not in KEY_KINDS:
                raise ConfigError(f"fairness key {kind!r} is not one of {', '.join(KEY_KINDS)}")

    def key_kind(self, transport: str | None) -> str:
        """The key kind in force for ``transport`` (the default for None)."""
        if transport is None:
            return self.default_key
        return self.transport_keys.get(transport, self.default_key)

    @property
    def enabled(self) -> bool:
        """Whether any transport computes flows (else every flow is ``FLOW_NONE``)."""
        return self.default_key != "none" or any(k != "none" for k in self.transport_keys.values())


def _check_values(cfg: Config, spec: str, table: LookupTable) -> None:
    """ConfigError naming the setting, the file and the line of a bad weight value."""
    where = setting_where(cfg, "fairness_weight_maps")
    kind, _sep, name = spec.strip().partition(":")
    values: list[tuple[str, str]] = []  # (location, value)
    if kind == "inline":
        for index, token in enumerate(split_braced(spec, inline_body(spec, "inline")), start=1):
            if token.startswith("{"):
                token = token[1:-1]
            values.append((f"{spec}: element {index}", token.partition("=")[2].strip()))
    elif kind == "static":
        body = name.strip()
        if body.startswith("{") and body.endswith("}"):
            body = body[1:-1].strip()
        values.append((spec, body))
    elif kind in ("texthash", "hash", "lmdb"):
        source = getattr(table, "source", None)  # hash/lmdb: the postmap source file
        path = source if isinstance(source, Path) else resolve_path(name, cfg.config_dir)
        try:
            text = read_table_file(path)
        except (OSError, ConfigError):
            return  # an index without its source file: values are checked when they match
        for number, entry in table_lines(text, str(path)):
            parts = entry.split(None, 1)
            if len(parts) == 2:
                values.append((f"{path}, line {number}", parts[1]))
    for location, value in values:
        try:
            parse_weight(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {location}: {exc}") from None


def fairness_settings(
    cfg: Config, warn: Callable[[str], None] = lambda _text: None
) -> FairnessSettings:
    """The fairness settings of ``cfg``; ConfigError for a bad weight table (module doc)."""
    default = cfg.get_str("default_fairness_key")
    overrides: dict[str, str] = {}
    for name in cfg.master:
        kind = cfg.transport(name).get_str("fairness_key")
        if kind != default:
            overrides[name] = kind
    tables = open_maps(cfg, "fairness_weight_maps")
    for spec, table in zip(cfg.get_list("fairness_weight_maps"), tables, strict=True):
        _check_values(cfg, spec, table)
    return FairnessSettings(
        default_key=default,
        transport_keys=MappingProxyType(overrides) if overrides else _NO_KEYS,
        weights=WeightTable(tables, warn) if tables else None,
    )


def flow_key(envelope: FlowEnvelope, kind: str) -> tuple[str, str]:
    """(flow key ``kind:value``, bare value) of ``envelope`` for key ``kind``; ("", "") for
    ``none``."""
    if kind == "none":
        return "", ""
    if kind == "sender_domain":
        sender = envelope.sender
        value = sender.rpartition("@")[2].lower() if sender else "<>"
    elif kind == "sender":
        value = envelope.sender.lower() or "<>"
    elif kind == "sasl_username":
        value = envelope.sasl_username or "<unauthenticated>"
    elif kind == "client_address":
        value = envelope.client_addr or "<local>"
    else:
        raise ConfigError(f"fairness key {kind!r} is not one of {', '.join(KEY_KINDS)}")
    return f"{kind}:{value}", value


def flow_of(
    envelope: FlowEnvelope, settings: FairnessSettings, transport: str | None = None
) -> Flow:
    """The message's flow for ``transport`` (None: the default key; see the module doc)."""
    key, bare = flow_key(envelope, settings.key_kind(transport))
    if not key:
        return FLOW_NONE
    weights = settings.weights
    found = weights.find(key, bare) if weights is not None else None
    if found is None:
        return Flow(key)
    weight, tenant = found
    if tenant:
        return Flow(f"tenant:{tenant}", weight, tenant)
    return Flow(key, weight)


def transport_flows(envelope: FlowEnvelope, settings: FairnessSettings) -> Mapping[str, Flow]:
    """Flows of the transports whose key kind differs from the default (usually empty)."""
    if not settings.transport_keys:
        return _NO_FLOWS
    return {name: flow_of(envelope, settings, name) for name in settings.transport_keys}
