"""Did-you-mean suggestions for unknown names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def suggestion(name: str, known: Iterable[str]) -> str | None:
    """The help line for an unknown name: ``"did you mean 'x'?"`` for the closest known name, None when none is close.

    Parameters
    ----------
    name : str
        The name given.
    known : Iterable[str]
        The names that would have been accepted.

    Returns
    -------
    str or None
        What a :class:`attngate.errors.Problem` carries as its ``help``; for a ``name`` that is no str (a caller's
        ``[1]`` where names go), what was expected.
    """
    if not isinstance(name, str):
        return f"a name, a str, not {type(name).__name__}"
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"did you mean {match[0]!r}?" if match else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest known name, ``""`` when none is close: for a message that has no
    help field of its own (a click ``BadParameter``); a :class:`attngate.errors.Problem` takes :func:`suggestion`
    as its ``help`` instead."""
    found = suggestion(name, known)
    return f" ({found})" if found else ""
