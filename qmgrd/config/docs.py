"""Render the parameter table as Markdown for README.md (STYLE §7: declared once).

``python -m qmgrd.config.docs`` prints the table; README.md embeds its output
between the ``<!-- params:begin -->`` and ``<!-- params:end -->`` markers, and a
test checks that the README is current.
"""

from __future__ import annotations

from qmgrd.config import describe

BEGIN = "<!-- params:begin -->"
END = "<!-- params:end -->"


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


def embed(readme: str) -> str:
    """``readme`` with the table between the markers replaced by the current one."""
    head, sep, rest = readme.partition(BEGIN)
    if not sep:
        raise ValueError(f"README has no {BEGIN} marker")
    _old, sep2, tail = rest.partition(END)
    if not sep2:
        raise ValueError(f"README has no {END} marker")
    return f"{head}{BEGIN}\n{parameter_table()}{END}{tail}"


if __name__ == "__main__":  # pragma: no cover - a developer tool
    import sys
    from pathlib import Path

    if sys.argv[1:] == ["--update"]:
        path = Path("README.md")
        path.write_text(embed(path.read_text()))
    else:
        print(parameter_table(), end="")
