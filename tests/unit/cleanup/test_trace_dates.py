"""``LastDate``: mail_date remembered per second, never another second's text."""

from __future__ import annotations

from qmgrd.cleanup.trace import LastDate, mail_date


def test_last_date_is_mail_date_for_every_second() -> None:
    """Within one second the text is reused; a new second (either way) is formatted anew."""
    dates = LastDate()
    for now in (1790000000.25, 1790000000.75, 1790000001.0, 1790000000.99, 1789999999.5):
        assert dates(now) == mail_date(now)


def test_last_date_floors_like_localtime() -> None:
    """Just before a second boundary is still the earlier second (time.localtime floors)."""
    dates = LastDate()
    assert dates(1790000001.0) == mail_date(1790000001.0)
    assert dates(1790000000.999999) == mail_date(1790000000.999999)
