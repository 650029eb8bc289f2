"""The precision of every time Diarist serves: seconds rounded to the millisecond (transcripts, their decode
windows, live events). Every export format can represent it and no alignment method resolves better."""

from __future__ import annotations

from typing import overload


@overload
def round_seconds(seconds: float) -> float: ...
@overload
def round_seconds(seconds: None) -> None: ...


def round_seconds(seconds: float | None) -> float | None:
    """``seconds`` rounded to the millisecond; monotonic (``a <= b`` gives ``round_seconds(a) <=
    round_seconds(b)``), so ordering invariants survive it. None stays None."""
    return None if seconds is None else round(seconds, 3)
