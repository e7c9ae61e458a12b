"""``qmgrd postconf``: print and edit parameters, like Postfix's postconf(1).

Modes (as in Postfix):

- no flag: every parameter with its value as written in main.cf or its
  default, *unexpanded* (postconf prints ``$myhostname``, not its value),
  including ``t_<suffix>`` for each master.cf service and every name set in
  main.cf;
- ``-d``: the defaults from the parameter table (no configuration is read,
  so it works on a broken one);
- ``-n``: only the names set in main.cf;
- ``-x``: values with ``$name`` expanded (with no flag or ``-n``);
- ``-h``: the value only, without ``name =`` (``$(qmgrd postconf -h myhostname)``);
- ``-e name=value ...``: edit main.cf in place (`qmgrd.config.edit`), after
  checking that the whole configuration with the edit still loads;
- ``-# name ...``: comment out those settings in main.cf (same check);
- ``-M [service[/type] ...]``: print master.cf entries, one per line, in
  postconf's column layout.

With names, only those are printed, in the order given; a name that is
neither declared nor set in main.cf is an error (exit 1), and so is a bad
configuration. Output without names is sorted by name. Warnings (unused
parameters) go to ``err`` as ``qmgrd: warning: ...``. Parameters Postfix has
but qmgrd refuses (`qmgrd.config.postfix`) do not stop postconf from printing:
they are shown as warnings, so the operator can still inspect and fix main.cf.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from qmgrd.config.config import MAIN_CF, MASTER_CF, Config, compute_defaults, load_config
from qmgrd.config.edit import comment_params, parse_assignment, set_params, write_atomically
from qmgrd.config.expand import is_known
from qmgrd.config.files import logical_lines, parse_master_cf, read_text
from qmgrd.config.params import PARAMS, PER_TRANSPORT, split_transport_name
from qmgrd.errors import ConfigError

_PROG = "qmgrd"


@dataclass(frozen=True, slots=True)
class PostconfArgs:
    """What the command line asked for."""

    names: list[str]
    defaults: bool = False
    nondefault: bool = False
    expand: bool = False
    value_only: bool = False
    edit: bool = False
    comment: bool = False
    master: bool = False


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


def _load(config_dir: Path, err: TextIO, main_text: str | None = None) -> Config:
    cfg = load_config(config_dir, main_text=main_text, strict=False)
    for warning in (*cfg.warnings, *cfg.refused):
        print(f"{_PROG}: warning: {warning}", file=err)
    return cfg


def _config_values(
    config_dir: Path, *, nondefault: bool, expand: bool, names: list[str], err: TextIO
) -> dict[str, str]:
    cfg = _load(config_dir, err)
    services = frozenset(cfg.master)
    set_names = {name: s.value for name, s in cfg.main_settings.items()}
    for name in names:
        if name not in set_names and not is_known(name, services):
            raise ConfigError(f"unknown parameter: {name}")
    if nondefault:
        wanted = [n for n in (names or list(set_names)) if n in set_names]
    else:
        wanted = names or [
            *PARAMS,
            *(f"{t}_{suffix}" for t in services for suffix in PER_TRANSPORT),
            *set_names,
        ]
    values: dict[str, str] = {}
    for name in wanted:
        if expand:
            values[name] = cfg.get_str(name)
        else:
            raw = cfg.raw(name)
            values[name] = raw if raw is not None else ""
    return values


def _edit(config_dir: Path, args: PostconfArgs, err: TextIO) -> None:
    """-e / -#: build the new main.cf, load it as the daemon would, then write it."""
    main_path = Path(config_dir) / MAIN_CF
    text = read_text(main_path)
    if args.edit:
        if not args.names:
            raise ConfigError("-e needs name=value arguments")
        new_text = set_params(text, dict(parse_assignment(a) for a in args.names))
    else:
        if not args.names:
            raise ConfigError("-# needs parameter names")
        new_text = comment_params(text, args.names)
    cfg = load_config(config_dir, main_text=new_text)  # strict: what the daemon would refuse
    for warning in cfg.warnings:
        print(f"{_PROG}: warning: {warning}", file=err)
    write_atomically(main_path, new_text)


def _master_lines(config_dir: Path, names: list[str]) -> list[str]:
    """-M: master.cf entries in postconf's layout, optionally only ``service[/type]``."""
    path = Path(config_dir) / MASTER_CF
    text = read_text(path)
    parse_master_cf(text, path)  # errors first, with their line
    out: list[str] = []
    for _number, line in logical_lines(text, path):
        fields = line.split()
        service, kind = fields[0], fields[1]
        if names and not any(n in (service, f"{service}/{kind}") for n in names):
            continue
        widths = (10, 5, 7, 7, 7, 7, 7)
        head = "".join(f"{f:<{w}} " for f, w in zip(fields[:7], widths, strict=True))
        out.append(f"{head}{' '.join(fields[7:])}")
    return out


def postconf_command(config_dir: Path, args: PostconfArgs, *, out: TextIO, err: TextIO) -> int:
    """Run postconf (module doc); exit status 0, or 1 with ``qmgrd: fatal: ...`` on ``err``."""
    try:
        if args.edit or args.comment:
            _edit(config_dir, args, err)
            return 0
        if args.master:
            for line in _master_lines(config_dir, args.names):
                print(line, file=out)
            return 0
        if args.defaults:
            values = _defaults_values(args.names)
        else:
            values = _config_values(
                config_dir,
                nondefault=args.nondefault,
                expand=args.expand,
                names=args.names,
                err=err,
            )
    except ConfigError as exc:
        print(f"{_PROG}: fatal: {exc}", file=err)
        return 1
    order = args.names if args.names else sorted(values)
    for name in order:
        if name in values:
            print(values[name] if args.value_only else f"{name} = {values[name]}", file=out)
    return 0
