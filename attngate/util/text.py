"""The width attngate lays text out in: whatever COLUMNS or the terminal says, between a floor and a ceiling, so that
``COLUMNS=0``, ``COLUMNS=1`` or ``COLUMNS=100000`` still give lines a person reads. (What an input's text may hold
is made visible by attngate.errors.visible.)"""

from __future__ import annotations

import os
import shutil

#: narrower than this, a gate name and its value no longer share a line
MIN_COLUMNS = 40
#: wider than this, a line is no longer read as one
MAX_COLUMNS = 200


def bounded_width(width: int) -> int:
    """``width`` held between MIN_COLUMNS and MAX_COLUMNS."""
    return min(max(width, MIN_COLUMNS), MAX_COLUMNS)


def bound_columns() -> str | None:
    """Set ``COLUMNS`` to the bounded width where it is set to something else (0, 1, 10**5, not a number) or the
    terminal is outside the bounds, so that every layout of the run (rich's, the help's, the line wrapper's) reads
    one; returns the value it had (None: unset), for the caller to put back."""
    before = os.environ.get("COLUMNS")
    width = shutil.get_terminal_size().columns  # COLUMNS when a positive number, else the terminal's, else 80
    if bounded_width(width) != width or before not in (None, str(width)):
        os.environ["COLUMNS"] = str(bounded_width(width))
    return before


def restore_columns(before: str | None) -> None:
    """Put ``COLUMNS`` back as bound_columns found it."""
    if before is None:
        os.environ.pop("COLUMNS", None)
    else:
        os.environ["COLUMNS"] = before
