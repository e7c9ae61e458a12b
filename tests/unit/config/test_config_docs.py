"""The README's parameter section is generated from the parameter table and kept current."""

from __future__ import annotations

from pathlib import Path

from qmgrd.config import describe
from qmgrd.config.docs import embed, parameter_table

README = Path(__file__).resolve().parents[3] / "README.md"


def test_table_lists_every_parameter_once() -> None:
    """Each declared parameter has exactly one row, with its default."""
    table = parameter_table()
    for name, _kind, default, _per, _desc in describe():
        assert table.count(f"| `{name}` |") == 1, name
        if default:
            assert f"`{default}`" in table.split(f"| `{name}` |", 1)[1].split("\n", 1)[0]


def test_readme_parameter_section_is_current() -> None:
    """README.md carries the table as generated now (run `python -m qmgrd.config.docs --update`)."""
    text = README.read_text()
    assert embed(text) == text
