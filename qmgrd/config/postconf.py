"""``qmgrd postconf``: print parameters as ``name = value``, like Postfix's postconf(1).

Modes (mutually exclusive, as in Postfix):

- no flag: every parameter with its value as written in main.cf or its
  default, *unexpanded* (postconf prints ``$myhostname``, not its value),
  including ``t_<suffix>`` for each master.cf service and every name set in
  main.cf;
- ``-d``: the defaults from the parameter table (no configuration is read,
  so it works on a broken one);
- ``-n``: only the names set in main.cf.

With names, only those are printed, in the order given; a name that is
neither declared nor set in main.cf is an error (exit 1), and so is a bad
configuration. Output without names is sorted by name. Warnings (unused
parameters) go to ``err`` as ``qmgrd: warning: ...``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from qmgrd.config.config import compute_defaults, load_config
from qmgrd.config.expand import is_known
from qmgrd.config.params import PARAMS, PER_TRANSPORT, split_transport_name
from qmgrd.errors import ConfigError

_PROG = "qmgrd"


def _defaults_values(names: list[str]) -> dict[str, str]:
    """Default values for -d; a transport-specific name defaults to ``$default_<suffix>``."""
    defaults = compute_defaults()
    if not names:
        return defaults
    values: dict[str, str] = {}
    for name in names:
        if name in defaults:
            values[name] = defaults[name]
            continue
        split = split_transport_name(name, None)
        if split is None:
            raise ConfigError(f"unknown parameter: {name}")
        values[name] = f"${split[1].name}"
    return values


def _config_values(
    config_dir: Path, *, nondefault: bool, names: list[str], err: TextIO
) -> dict[str, str]:
    cfg = load_config(config_dir)
    for warning in cfg.warnings:
        print(f"{_PROG}: warning: {warning}", file=err)
    services = frozenset(cfg.master)
    set_names = {name: s.value for name, s in cfg.main_settings.items()}
    for name in names:
        if name not in set_names and not is_known(name, services):
            raise ConfigError(f"unknown parameter: {name}")
    if nondefault:
        wanted = names or list(set_names)
        return {name: set_names[name] for name in wanted if name in set_names}
    wanted = names or [
        *PARAMS,
        *(f"{t}_{suffix}" for t in services for suffix in PER_TRANSPORT),
        *set_names,
    ]
    values: dict[str, str] = {}
    for name in wanted:
        raw = cfg.raw(name)
        values[name] = raw if raw is not None else ""
    return values


def postconf_command(
    config_dir: Path,
    *,
    defaults: bool,
    nondefault: bool,
    names: list[str],
    out: TextIO,
    err: TextIO,
) -> int:
    """Print parameters; exit status 0, or 1 with ``qmgrd: fatal: ...`` on ``err``."""
    try:
        if defaults:
            values = _defaults_values(names)
        else:
            values = _config_values(config_dir, nondefault=nondefault, names=names, err=err)
    except ConfigError as exc:
        print(f"{_PROG}: fatal: {exc}", file=err)
        return 1
    order = names if names else sorted(values)
    for name in order:
        if name in values:
            print(f"{name} = {values[name]}", file=out)
    return 0
