"""Did-you-mean suggestions for unknown names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest known name, or ``""`` when none is close."""
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""
