"""Render the parameter table as Markdown for README.md (STYLE §7: declared once).

``python -m qmgrd.config.docs`` prints the table; README.md embeds its output
between the ``<!-- params:begin -->`` and ``<!-- params:end -->`` markers, and
the list of Postfix parameters qmgrd refuses (`qmgrd.config.postfix`) between
``<!-- postfix:begin -->`` and ``<!-- postfix:end -->``; a test checks that the
README is current.
"""

from __future__ import annotations

from qmgrd.config import describe
from qmgrd.config.params import PARAMS
from qmgrd.config.postfix import POSTFIX_NAMES, fatal_names

BEGIN = "<!-- params:begin -->"
END = "<!-- params:end -->"
POSTFIX_BEGIN = "<!-- postfix:begin -->"
POSTFIX_END = "<!-- postfix:end -->"


def parameter_table() -> str:
    """The Markdown table of every parameter with its default and meaning."""
    lines = [
        "| parameter | type | default | per transport | meaning |",
        "|---|---|---|---|---|",
    ]
    for name, kind, default, per_transport, description in describe():
        shown = f"`{default}`" if default else "(empty)"
        shown = shown.replace("|", "\\|")
        lines.append(
            f"| `{name}` | {kind} | {shown} | {'yes' if per_transport else ''} | "
            f"{description.replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def postfix_table() -> str:
    """The Postfix parameters that stop qmgrd (when set to a value it cannot honour), grouped."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in fatal_names():
        if name not in PARAMS:  # implemented since: no longer refused
            by_reason.setdefault(reason, []).append(name)
    lines = [
        "| refused when set (to a value other than empty or Postfix's default) | why, "
        "and what to do |",
        "|---|---|",
    ]
    for reason, names in sorted(by_reason.items(), key=lambda item: item[1][0]):
        lines.append(f"| {', '.join(f'`{n}`' for n in names)} | {reason} |")
    refusable = {n for names in by_reason.values() for n in names}
    ignored = sorted(POSTFIX_NAMES - set(PARAMS) - refusable)
    lines.append("")
    lines.append(
        f"The other {len(ignored)} parameters of Postfix 3.7 that qmgrd does not have "
        "(performance hints, local and virtual mailbox delivery, daemon plumbing, postscreen, "
        "LMTP, `compatibility_level`, ...) are ignored with a warning naming file, line and "
        "parameter:"
    )
    lines.append("")
    lines.append(f"<details><summary>the {len(ignored)} ignored parameters</summary>")
    lines.append("")
    lines.append(", ".join(f"`{name}`" for name in ignored))
    lines.append("")
    lines.append("</details>")
    return "\n".join(lines) + "\n"


def _replace(text: str, begin: str, end: str, body: str) -> str:
    head, sep, rest = text.partition(begin)
    if not sep:
        raise ValueError(f"README has no {begin} marker")
    _old, sep2, tail = rest.partition(end)
    if not sep2:
        raise ValueError(f"README has no {end} marker")
    return f"{head}{begin}\n{body}{end}{tail}"


def embed(readme: str) -> str:
    """``readme`` with the generated sections between their markers replaced by current ones."""
    text = _replace(readme, BEGIN, END, parameter_table())
    return _replace(text, POSTFIX_BEGIN, POSTFIX_END, postfix_table())


if __name__ == "__main__":  # pragma: no cover - a developer tool
    import sys
    from pathlib import Path

    if sys.argv[1:] == ["--update"]:
        path = Path("README.md")
        path.write_text(embed(path.read_text()))
    else:
        print(parameter_table(), end="")
