"""Listener TLS: Postfix's smtpd_tls_* parameters turned into a checked server SSLContext.

``TlsSettings`` is built once per configuration (start and each reload), so a
renewed certificate is read at SIGHUP and used by the sessions that start
after it. Everything that can be wrong with the files is found here, before
anything is swapped in, and reported as a ConfigError naming where the
parameter is set and which parameter it is:

- a missing or unreadable ``smtpd_tls_cert_file``, ``smtpd_tls_key_file`` or
  ``smtpd_tls_chain_files`` entry;
- a certificate or key that does not parse, or a key that does not match its
  certificate (OpenSSL's check in ``load_cert_chain``);
- ``smtpd_tls_security_level`` ``may`` / ``encrypt`` or
  ``smtpd_tls_wrappermode = yes`` without a certificate;
- a protocol list that leaves no TLS version allowed.

Levels (Postfix's): ``none`` offers no STARTTLS; ``may`` offers it;
``encrypt`` offers it and answers MAIL, RCPT, DATA and AUTH before it with
``530 5.7.0 Must issue a STARTTLS command first``. Wrapper mode (SMTPS, port
465) starts TLS before the greeting. The protocol lists accept Postfix's two
syntaxes: ``>=TLSv1.2`` and ``!SSLv2, !SSLv3, !TLSv1, !TLSv1.1``; SSLv2 and
SSLv3 are never allowed, and TLSv1 / TLSv1.1 are never offered (RFC 8996)
even where a list allows them. ``smtpd_tls_mandatory_protocols`` applies at level
``encrypt`` (and in wrapper mode), ``smtpd_tls_protocols`` otherwise, as in
Postfix.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from qmgrd.errors import ConfigError

LEVELS = ("none", "may", "encrypt")
_VERSIONS: tuple[tuple[str, ssl.TLSVersion], ...] = (
    ("TLSv1", ssl.TLSVersion.TLSv1),
    ("TLSv1.1", ssl.TLSVersion.TLSv1_1),
    ("TLSv1.2", ssl.TLSVersion.TLSv1_2),
    ("TLSv1.3", ssl.TLSVersion.TLSv1_3),
)
_NAMES = [name for name, _ in _VERSIONS]


class _ConfigLike(Protocol):
    @property
    def config_dir(self) -> Path: ...

    def get_str(self, name: str) -> str: ...
    def get_bool(self, name: str) -> bool: ...
    def get_list(self, name: str) -> tuple[str, ...]: ...
    def get_path(self, name: str) -> Path: ...


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """One listener's TLS: the level, the server context (None at ``none``), the modes."""

    level: str = "none"
    context: ssl.SSLContext | None = None
    wrappermode: bool = False
    auth_only: bool = False  # smtpd_tls_auth_only: AUTH only over TLS, loopback included

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ConfigError(f"smtpd_tls_security_level: unknown level {self.level!r}")
        if (self.level != "none" or self.wrappermode) and self.context is None:
            raise ConfigError("smtpd_tls_security_level: TLS needs a certificate")

    @property
    def starttls(self) -> bool:
        """Whether STARTTLS is offered (a level above none, not in wrapper mode)."""
        return self.level != "none" and not self.wrappermode

    @property
    def required(self) -> bool:
        """Whether mail needs TLS first (level encrypt; wrapper mode always has it)."""
        return self.level == "encrypt"


NO_TLS = TlsSettings()
"""A listener without TLS (level none)."""


def protocol_range(text: str, param: str) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    """(minimum, maximum) TLS version of a Postfix protocol list; ConfigError if bad or empty."""
    items = [item for item in text.replace(",", " ").replace(":", " ").split() if item]
    allowed = set(_NAMES)
    for item in items:
        if item.startswith(">="):
            name = item[2:]
            if name not in _NAMES:
                raise ConfigError(f"{param}: unknown protocol {name!r} in {text!r}")
            allowed -= set(_NAMES[: _NAMES.index(name)])
        elif item.startswith("<="):
            name = item[2:]
            if name not in _NAMES:
                raise ConfigError(f"{param}: unknown protocol {name!r} in {text!r}")
            allowed -= set(_NAMES[_NAMES.index(name) + 1 :])
        elif item.startswith("!"):
            name = item[1:]
            if name in ("SSLv2", "SSLv3"):
                continue  # never allowed anyway
            if name not in _NAMES:
                raise ConfigError(f"{param}: unknown protocol {name!r} in {text!r}")
            allowed.discard(name)
        elif item in ("SSLv2", "SSLv3"):
            raise ConfigError(f"{param}: {item} is not supported (it is insecure)")
        elif item in _NAMES:
            pass  # Postfix's inclusion syntax: listing a name leaves it allowed
        else:
            raise ConfigError(f"{param}: unknown protocol {item!r} in {text!r}")
    # TLSv1 and TLSv1.1 are obsolete (RFC 8996): allowed in a list, never offered.
    versions = [v for name, v in _VERSIONS if name in allowed and v >= ssl.TLSVersion.TLSv1_2]
    if not versions:
        raise ConfigError(
            f"{param}: {text!r} allows no TLS protocol qmgrd offers (TLSv1.2, TLSv1.3)"
        )
    return versions[0], versions[-1]


def _readable(path: Path, param: str, where: str) -> None:
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as exc:
        raise ConfigError(
            f"{where}parameter {param}: cannot read {path}: {exc.strerror or exc}"
        ) from None


def build_context(
    cert: Path | None,
    key: Path | None,
    chain_files: tuple[Path, ...],
    protocols: str,
    *,
    where: dict[str, str] | None = None,
) -> ssl.SSLContext:
    """A server SSLContext with the certificate(s) loaded and checked (module docstring).

    ``where`` maps a parameter name to its "file, line: " prefix for messages.
    """
    places = where or {}
    low, high = protocol_range(protocols, "smtpd_tls_protocols")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = low
    ctx.maximum_version = high  # both TLSv1.2 or later: no deprecated version is set
    ctx.options |= ssl.OP_NO_COMPRESSION
    if chain_files:
        for path in chain_files:
            at = places.get("smtpd_tls_chain_files", "")
            _readable(path, "smtpd_tls_chain_files", at)
            try:
                ctx.load_cert_chain(path)
            except ssl.SSLError as exc:
                raise ConfigError(
                    f"{at}parameter smtpd_tls_chain_files: {path}: no usable key and certificate "
                    f"(the key must come first, then its certificate chain): {exc.reason or exc}"
                ) from None
        return ctx
    if cert is None:
        raise ConfigError("smtpd_tls_cert_file: TLS needs a certificate")
    key = key or cert
    _readable(cert, "smtpd_tls_cert_file", places.get("smtpd_tls_cert_file", ""))
    _readable(key, "smtpd_tls_key_file", places.get("smtpd_tls_key_file", ""))
    try:
        ssl.create_default_context(cafile=str(cert))  # parses the certificate(s) alone
    except ssl.SSLError as exc:
        at = places.get("smtpd_tls_cert_file", "")
        raise ConfigError(
            f"{at}parameter smtpd_tls_cert_file: {cert}: not a PEM certificate: {exc.reason or exc}"
        ) from None
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        at = places.get("smtpd_tls_key_file", "")
        reason = exc.reason or str(exc)
        what = (
            "does not match the certificate in smtpd_tls_cert_file"
            if "MISMATCH" in reason.upper()
            else "not a usable PEM private key"
        )
        raise ConfigError(f"{at}parameter smtpd_tls_key_file: {key}: {what} ({reason})") from None
    return ctx


def tls_settings(cfg: _ConfigLike, where: dict[str, str] | None = None) -> TlsSettings:
    """The listener TLS settings of a configuration view (a ConfigError names the parameter)."""
    level = cfg.get_str("smtpd_tls_security_level") or "none"
    wrapper = cfg.get_bool("smtpd_tls_wrappermode")
    places = where or {}
    if level not in LEVELS:
        raise ConfigError(
            f"{places.get('smtpd_tls_security_level', '')}parameter smtpd_tls_security_level: "
            f"unknown level {level!r} (expected none, may or encrypt)"
        )
    cert_text = cfg.get_str("smtpd_tls_cert_file")
    chain = tuple(cfg.config_dir / p for p in cfg.get_list("smtpd_tls_chain_files"))
    if level == "none" and not wrapper:
        return TlsSettings(auth_only=cfg.get_bool("smtpd_tls_auth_only"))
    if not cert_text and not chain:
        at = places.get("smtpd_tls_security_level", "")
        raise ConfigError(
            f"{at}parameter smtpd_tls_security_level: level {level}"
            f"{' with smtpd_tls_wrappermode' if wrapper else ''} needs smtpd_tls_cert_file "
            "and smtpd_tls_key_file (or smtpd_tls_chain_files)"
        )
    mandatory = level == "encrypt" or wrapper
    protocols_param = "smtpd_tls_mandatory_protocols" if mandatory else "smtpd_tls_protocols"
    protocols = cfg.get_str(protocols_param)
    try:
        protocol_range(protocols, protocols_param)
    except ConfigError as exc:
        raise ConfigError(f"{places.get(protocols_param, '')}parameter {exc}") from None
    cert = cfg.get_path("smtpd_tls_cert_file") if cert_text else None
    key = cfg.get_path("smtpd_tls_key_file") if cfg.get_str("smtpd_tls_key_file") else None
    context = build_context(cert, key, chain, protocols, where=places)
    return TlsSettings(
        level=level,
        context=context,
        wrappermode=wrapper,
        auth_only=cfg.get_bool("smtpd_tls_auth_only"),
    )


def session_facts(ssl_object: ssl.SSLObject | None) -> TlsFacts | None:
    """What a Received header and the logs say about a TLS session (None without TLS)."""
    if ssl_object is None:
        return None
    cipher = ssl_object.cipher()
    name, _proto, bits = cipher if cipher else ("unknown", "", 0)
    return TlsFacts(protocol=ssl_object.version() or "unknown", cipher=name, bits=bits or 0)


@dataclass(frozen=True, slots=True)
class TlsFacts:
    """A session's TLS: ``TLSv1.3``, ``TLS_AES_256_GCM_SHA384``, 256 (for ``with ESMTPS``)."""

    protocol: str
    cipher: str
    bits: int
